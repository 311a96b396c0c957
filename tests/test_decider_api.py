"""The decider's HTTP API, served by a real `llmgw-decider` process (tests/decider_harness.py)
reading a fake Prometheus: every endpoint's shape, the placement rules and their reasons in
enforce and observe mode, `missing`, authentication, bad bodies, the reservation lifecycle,
holds, /metrics, and reloads by SIGHUP and `POST /-/reload`.

The site (FACILITY, READINGS), margin 10 %, node share 400 W, 8 GPUs of 700 W per node:

| rack | cap    | limit  | load                              | room    | nodes  | condition  |
|------|--------|--------|-----------------------------------|---------|--------|------------|
| r1   | 10 000 |  9 000 | measured 3 000 + other 500 = 3500 |  5 500  | a1, a2 | ok         |
| r2   | 20 000 | 18 000 | measured 2 000                    | 16 000  | b1, b2 | ok         |
| r3   | 20 000 | 18 000 | measured 0                        | 18 000  | c1     | hot (12 s) |
| r4   |  5 000 |  4 500 | measured 6 000: over its cap      | −1 500  | d1     | ok         |
| r5   | 100 000| 90 000 | measured 0                        | 90 000  | w1     | warm       |

pdu/r1-a (a1, a2): cap 8 000, limit 7 200, measured 1 000. row/1 (every node): no budget.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from decider.snapshot import PARTS
from tests.decider_harness import (
    TOKEN,
    Decider,
    FakePrometheus,
    Readings,
    decider_yaml,
    metric_value,
    poll,
)

NODES = {
    "a1": ["rack/r1", "pdu/r1-a", "row/1"],
    "a2": ["rack/r1", "pdu/r1-a", "row/1"],
    "b1": ["rack/r2", "row/1"],
    "b2": ["rack/r2", "row/1"],
    "c1": ["rack/r3", "row/1"],
    "d1": ["rack/r4", "row/1"],
    "w1": ["rack/r5", "row/1"],
}

FACILITY: dict[str, Any] = {
    "defaults": {"margin": 0.1},
    "domains": {
        "rack/r1": {"cap_watts": 10000, "other_watts": 500},
        "rack/r2": {"cap_watts": 20000},
        "rack/r3": {"cap_watts": 20000},
        "rack/r4": {"cap_watts": 5000},
        "rack/r5": {"cap_watts": 100000},
        "pdu/r1-a": {"cap_watts": 8000},
    },
    "profiles": {"p4": {"gpus": 4}, "big": {"gpus": 8, "power_watts": 5000}},
    "node_share_watts": 400,
    "mode": "enforce",
}


def readings() -> Readings:
    return Readings(
        membership={node: list(domains) for node, domains in NODES.items()},
        inventory=["rack/r1", "rack/r2", "rack/r3", "rack/r4", "rack/r5", "row/1"],
        measured={
            "rack/r1": 3000,
            "rack/r2": 2000,
            "rack/r3": 0,
            "rack/r4": 6000,
            "rack/r5": 0,
            "pdu/r1-a": 1000,
        },
        conditions={
            "pdu/r1-a": "ok",
            "rack/r1": "ok",
            "rack/r2": "ok",
            "rack/r3": "hot",
            "rack/r4": "ok",
            "rack/r5": "warm",
            "row/1": "ok",
        },
        ages={"rack/r3": 12},
        gpus=dict.fromkeys(NODES, 8),
        limits=dict.fromkeys(NODES, 700.0),
    )


#: Declared at 6 kW: too much for rack r1's 5.5 kW of room, fine for r2 and r5.
BIG = {"model": "llama", "profile": "custom", "gpus": 4, "power_watts": 6000}
#: Declared at 1 kW: fits everywhere not refused for another reason.
SMALL = {"model": "llama", "profile": "custom", "gpus": 1, "power_watts": 1000}

R1_POWER = "rack r1: 3.5 of 10.0 kW measured (incl. 0.5 other), replica needs ~6.0, margin 10%"
R3_HOT = "rack r3 hot (reading 12s old)"
R4_OVER = "rack r4: over its cap, 6.0 of 5.0 kW measured"


def facility(**changes: Any) -> dict[str, Any]:
    return json.loads(json.dumps(FACILITY)) | changes


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus(readings())
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make(tmp_path: Path, fake: FakePrometheus) -> Iterator[Callable[..., Decider]]:
    """Start a decider (in enforce mode on FACILITY unless told) with every part fresh."""
    started: list[Decider] = []

    def start(
        facility_: dict[str, Any] | None = None,
        *,
        ready: bool = True,
        fresh: bool = True,
        **config: Any,
    ) -> Decider:
        decider = Decider(
            tmp_path / f"decider{len(started)}", fake.url, facility_ or FACILITY, **config
        )
        started.append(decider)
        decider.start(wait_ready=ready)
        if ready and fresh:
            decider.wait_fresh()
        return decider

    try:
        yield start
    finally:
        for decider in started:
            decider.close()


@pytest.fixture
def decider(make: Callable[..., Decider]) -> Decider:
    return make()


def by_node(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["node"]: entry for entry in answer["nodes"]}


# --- placements ----------------------------------------------------------------------------


def test_enforce_mode_refuses_past_the_margin_hot_and_over_cap_with_reasons(decider):
    answer = decider.place(BIG, ["a1", "b1", "c1", "d1", "w1"])

    assert set(answer) == {"mode", "order", "nodes", "missing", "summary"}
    assert answer["mode"] == "enforce"
    assert answer["missing"] == []
    nodes = by_node(answer)
    assert list(nodes) == ["a1", "b1", "c1", "d1", "w1"], "verdicts keep the request's order"
    assert nodes["a1"]["allowed"] is False
    assert nodes["a1"]["reasons"] == [R1_POWER]
    assert nodes["a1"]["headroom_watts"] == -500.0  # 5,500 W of room, 6,000 W asked
    assert nodes["c1"]["allowed"] is False
    assert nodes["c1"]["reasons"] == [R3_HOT]
    assert nodes["c1"]["condition"] == "hot"
    assert nodes["d1"]["allowed"] is False
    assert nodes["d1"]["reasons"] == [R4_OVER]
    assert nodes["b1"] == {
        "node": "b1",
        "allowed": True,
        "estimate_watts": 6000.0,
        "reasons": [],
        "condition": "ok",
        "headroom_watts": 10000.0,
        "scores": {"condition": 0, "rack_room": -1, "spread": 0, "scheduler_order": 1},
    }
    assert nodes["w1"]["allowed"] is True
    assert nodes["w1"]["condition"] == "warm"
    assert nodes["w1"]["headroom_watts"] == 84000.0
    for entry in answer["nodes"]:
        assert "would_refuse" not in entry
        assert entry["estimate_watts"] == 6000.0
        assert ("scores" in entry) == entry["allowed"]
    # Allowed only, by condition first: w1 has far more room but is warm.
    assert answer["order"] == ["b1", "w1"]
    assert answer["summary"].startswith("2/5 nodes allowed (")
    for part in ("1 power_cap", "1 hot", "1 over_cap"):
        assert part in answer["summary"]


def test_a_node_fits_up_to_exactly_the_margin(decider):
    """Rack r1 has 5,500 W of room under cap × (1 − margin): 5,500 W fits, 5,501 W does not."""
    exact = decider.place({**BIG, "power_watts": 5500}, ["a1"])
    assert by_node(exact)["a1"]["allowed"] is True
    assert by_node(exact)["a1"]["headroom_watts"] == 0.0
    over = decider.place({**BIG, "power_watts": 5501}, ["a1"])
    assert by_node(over)["a1"]["reasons"] == [
        "rack r1: 3.5 of 10.0 kW measured (incl. 0.5 other), replica needs ~5.5, margin 10%"
    ]
    assert over["order"] == []


def test_every_budgeted_domain_of_the_node_is_checked(decider):
    """pdu/r1-a has 6,200 W of room and rack r1 5,500 W: 7,000 W passes both, named each."""
    answer = decider.place({**BIG, "power_watts": 7000}, ["a2"])
    assert by_node(answer)["a2"]["reasons"] == [
        "pdu r1-a: 1.0 of 8.0 kW measured, replica needs ~7.0, margin 10%",
        "rack r1: 3.5 of 10.0 kW measured (incl. 0.5 other), replica needs ~7.0, margin 10%",
    ]
    assert by_node(answer)["a2"]["headroom_watts"] == -1500.0


def test_order_is_condition_then_rack_room_then_the_schedulers_order(decider):
    answer = decider.place(SMALL, ["w1", "a1", "b2", "b1"])
    assert all(entry["allowed"] for entry in answer["nodes"])
    scores = {node: entry["scores"] for node, entry in by_node(answer).items()}
    # Rack room in whole 1 kW replicas left after this one: r5 89, r2 15, r1 4.
    assert scores["w1"] == {"condition": 1, "rack_room": -89, "spread": 0, "scheduler_order": 0}
    assert scores["a1"] == {"condition": 0, "rack_room": -4, "spread": 0, "scheduler_order": 1}
    assert scores["b2"]["rack_room"] == scores["b1"]["rack_room"] == -15
    # b2 before b1: the same rack, so the scheduler's order decides.
    assert answer["order"] == ["b2", "b1", "a1", "w1"]


def test_estimates_declared_profile_derived_and_cpu(decider):
    nodes = ["b1"]
    derived = decider.place({"model": "m", "profile": "p4", "gpus": 4}, nodes)
    # 4 GPUs × 700 W + 400 W node share × 4/8 GPUs.
    assert by_node(derived)["b1"]["estimate_watts"] == 3000.0
    profile = decider.place({"model": "m", "profile": "big", "gpus": 8}, nodes)
    assert by_node(profile)["b1"]["estimate_watts"] == 5000.0
    declared = decider.place({"model": "m", "profile": "big", "gpus": 8, "power_watts": 123}, nodes)
    assert by_node(declared)["b1"]["estimate_watts"] == 123.0
    cpu = decider.place({"model": "m", "profile": "emb", "gpus": 0, "cpu_cores": 10}, nodes)
    assert by_node(cpu)["b1"]["estimate_watts"] == 60.0  # 10 cores × 6 W


def test_observe_mode_refuses_nothing_keeps_the_order_and_fills_would_refuse(make):
    decider = make(facility(mode="observe"))
    candidates = ["d1", "w1", "c1", "b1", "a1"]
    answer = decider.place(BIG, candidates)

    assert answer["mode"] == "observe"
    assert answer["order"] == candidates
    nodes = by_node(answer)
    assert all(entry["allowed"] and entry["reasons"] == [] for entry in nodes.values())
    assert nodes["a1"]["would_refuse"] == [R1_POWER]
    assert nodes["c1"]["would_refuse"] == [R3_HOT]
    assert nodes["d1"]["would_refuse"] == [R4_OVER]
    assert nodes["b1"]["would_refuse"] == nodes["w1"]["would_refuse"] == []
    assert nodes["a1"]["headroom_watts"] == -500.0
    assert answer["summary"].startswith("observe mode: 5/5 nodes allowed, 3 would be refused (")

    metrics = decider.metrics()
    allowed = {"call": "placement", "outcome": "allowed"}
    assert metric_value(metrics, "llmgw_decider_decisions_total", **allowed) == 5.0
    refused = {"call": "placement", "outcome": "refused"}
    assert metric_value(metrics, "llmgw_decider_decisions_total", **refused) == 0.0
    for rule in ("power_cap", "hot", "over_cap"):
        labels = {"call": "placement", "rule": rule}
        assert metric_value(metrics, "llmgw_decider_would_refuse_total", **labels) == 1.0
        assert metric_value(metrics, "llmgw_decider_refusals_total", **labels) == 0.0


def test_missing_data_is_named_and_blocks_nothing(fake, make):
    fake.readings.gpus.pop("b2")
    fake.readings.limits.pop("a2")
    fake.set("error", part="measured")  # never read: rack r4 is not known to be over its cap
    decider = make(fresh=False)
    missing = poll(
        lambda: decider.get("/v1/domains").json()["missing"], "the measured part to be missing"
    )
    assert len(missing) == 1
    assert missing[0].startswith(
        f"{PARTS['measured']}: never read from Prometheus: "
        "measured query `last_over_time(llmgw_domain_measured_watts["
    )

    answer = decider.place({"model": "m", "profile": "p", "gpus": 1}, ["d1", "b2", "a2", "zz"])
    nodes = by_node(answer)
    assert answer["missing"] == [
        missing[0],
        "membership unknown for node zz (no llmgw:node_domain:membership): no domain limits them",
        "GPU count unknown for nodes b2, zz: estimated with the whole node share",
        "GPU power limit unknown for nodes a2, zz: estimated at the site's largest, 700 W",
    ]
    assert nodes["d1"]["estimate_watts"] == 750.0  # 700 W + 400 W × 1/8
    assert nodes["a2"]["estimate_watts"] == 750.0  # the site's largest limit stands in
    assert nodes["b2"]["estimate_watts"] == 1100.0  # the whole 400 W node share: errs high
    assert nodes["zz"]["estimate_watts"] == 1100.0
    assert all(entry["allowed"] for entry in answer["nodes"])
    assert nodes["zz"]["condition"] == "unknown"
    assert nodes["zz"]["headroom_watts"] is None
    assert nodes["d1"]["headroom_watts"] == 3750.0  # rack r4 by its reservations alone
    # Rack room in replicas: r2 15, r1 10 (8.5 kW), r4 5; zz, with no rack, last.
    assert answer["order"] == ["b2", "a2", "d1", "zz"]


# --- authentication ------------------------------------------------------------------------

HOLD = {"reason": "feed maintenance"}


def mutating_calls(decider: Decider) -> list[tuple[str, str, Any]]:
    reservation = {"id": "r-auth", "replica": SMALL, "node": "b1"}
    return [
        ("POST", "/v1/reservations", reservation),
        ("DELETE", "/v1/reservations/r-exists", None),
        ("POST", "/v1/reservations/r-exists/confirm", None),
        ("POST", "/v1/domains/rack/r2/hold", HOLD),
        ("POST", "/v1/domains/rack/r2/release", None),
        ("POST", "/-/reload", None),
    ]


def call(decider: Decider, method: str, path: str, body: Any, token: str | None) -> Any:
    if method == "DELETE":
        return decider.delete(path, token=token)
    return decider.post(path, body, token=token)


def test_every_mutating_call_needs_the_token(decider):
    assert decider.reserve("r-exists", "b1", SMALL).status_code == 201
    decider.post("/v1/domains/rack/r2/hold", HOLD).raise_for_status()
    before = (decider.get("/v1/reservations").json(), decider.get("/v1/domains").json())

    for method, path, body in mutating_calls(decider):
        for token in (None, "wrong-token-0123456789", TOKEN + "x", TOKEN[:-1], "tökén-0123456789"):
            response = call(decider, method, path, body, token)
            assert response.status_code == 401, (method, path, token, response.text)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert "bearer token is required" in response.json()["detail"]
        # A scheme other than Bearer is not accepted either.
        headers = {"Authorization": f"Basic {TOKEN}"}
        response = decider.session.request(
            method, decider.url + path, json=body, headers=headers, timeout=10
        )
        assert response.status_code == 401, (method, path, response.text)
    # An unauthenticated caller learns nothing about its body either.
    response = decider.post(
        "/v1/reservations",
        data=b"{not json",
        token=None,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 401, response.text
    response = decider.post("/v1/domains/rack/r2/hold", {"reason": ""}, token=None)
    assert response.status_code == 401, response.text

    after = (decider.get("/v1/reservations").json(), decider.get("/v1/domains").json())
    assert after == before, "a refused call changed something"
    # Reads need no token.
    assert decider.post("/v1/placements", {"replica": SMALL, "candidates": ["b1"]}, token=None).ok
    for path in ("/v1/reservations", "/v1/domains", "/v1/headroom?profile=big", "/metrics"):
        assert decider.get(path).status_code == 200, path


def test_without_a_token_file_every_mutating_call_is_forbidden(make):
    decider = make(token=False)
    for method, path, body in mutating_calls(decider):
        for token in (None, TOKEN):
            response = call(decider, method, path, body, token)
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["detail"] == (
                "mutating calls are disabled: the decider has no token_file configured"
            )
    assert decider.get("/v1/reservations").json() == {"reservations": []}
    assert decider.domain("rack/r2")["held"] is None
    assert decider.post("/v1/placements", {"replica": SMALL, "candidates": ["b1"]}).ok


# --- bad bodies ----------------------------------------------------------------------------

REPLICA = {"model": "m", "profile": "p4", "gpus": 4}
BAD_PLACEMENTS = [
    (
        {"replica": {"model": "m", "profile": "p4"}, "candidates": ["b1"]},
        "replica.gpus: Field required",
    ),
    (
        {"replica": {**REPLICA, "gpus": -1}, "candidates": ["b1"]},
        "replica.gpus: Input should be greater than or equal to 0",
    ),
    (
        {"replica": {**REPLICA, "gpus": "four"}, "candidates": ["b1"]},
        "replica.gpus: Input should be a valid integer",
    ),
    (
        {"replica": {**REPLICA, "gpus": 1.5}, "candidates": ["b1"]},
        "replica.gpus: Input should be a valid integer",
    ),
    (
        {"replica": {**REPLICA, "power_watts": 0}, "candidates": ["b1"]},
        "replica.power_watts: Input should be greater than 0",
    ),
    (
        {"replica": {**REPLICA, "cpu_cores": "many"}, "candidates": ["b1"]},
        "replica.cpu_cores: Input should be a valid number",
    ),
    (
        {"replica": {**REPLICA, "model": ""}, "candidates": ["b1"]},
        "replica.model: String should have at least 1 character",
    ),
    (
        {"replica": {**REPLICA, "colour": "red"}, "candidates": ["b1"]},
        "replica.colour: Extra inputs are not permitted",
    ),
    (
        {"replica": REPLICA, "candidates": ["b1", "a1", "b1"]},
        "candidates: Value error, node 'b1' is listed more than once",
    ),
    (
        {"replica": REPLICA, "candidates": ["b1", ""]},
        "candidates.1: String should have at least 1 character",
    ),
    ({"replica": REPLICA, "candidates": "b1"}, "candidates: Input should be a valid list"),
    ({"replica": REPLICA, "candidates": [1]}, "candidates.0: Input should be a valid string"),
    ({"replica": REPLICA}, "candidates: Field required"),
    ({"replica": "llama", "candidates": []}, "replica: Input should be a valid dictionary"),
    ([], "body: Input should be a valid dictionary"),
]
BAD_RESERVATIONS = [
    ({"replica": REPLICA, "node": "b1"}, "id: Field required"),
    ({"id": "", "replica": REPLICA, "node": "b1"}, "id: String should have at least 1 character"),
    ({"id": 7, "replica": REPLICA, "node": "b1"}, "id: Input should be a valid string"),
    (
        {"id": "x", "replica": {**REPLICA, "gpus": None}, "node": "b1"},
        "replica.gpus: Input should be a valid integer",
    ),
    ({"id": "x", "replica": REPLICA, "node": ["b1"]}, "node: Input should be a valid string"),
    (
        {"id": "team/../x", "replica": REPLICA, "node": "b1"},
        "id: Value error, 'team/../x' is not names joined by '/'",
    ),
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Decider]:
    """One decider for the tests that change nothing."""
    server = FakePrometheus(readings())
    decider = Decider(tmp_path_factory.mktemp("shared"), server.url, FACILITY)
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        yield decider
    finally:
        decider.close()
        server.close()


def assert_names(response: Any, problem: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["detail"] == "; ".join(body["problems"])
    assert any(p.startswith(problem) for p in body["problems"]), (problem, body["problems"])


@pytest.mark.parametrize(("body", "problem"), BAD_PLACEMENTS)
def test_a_bad_placement_body_names_the_field(shared, body, problem):
    assert_names(shared.post("/v1/placements", body), problem)


@pytest.mark.parametrize(("body", "problem"), BAD_RESERVATIONS)
def test_a_bad_reservation_body_names_the_field(shared, body, problem):
    assert_names(shared.post("/v1/reservations", body), problem)


def test_every_problem_of_a_body_is_listed(shared):
    body = {"replica": {"model": "m", "gpus": -2}, "candidates": ["a", "a"]}
    response = shared.post("/v1/placements", body)
    assert response.status_code == 422
    assert response.json()["problems"] == [
        "replica.profile: Field required",
        "replica.gpus: Input should be greater than or equal to 0",
        "candidates: Value error, node 'a' is listed more than once",
    ]


@pytest.mark.parametrize("path", ["/v1/placements", "/v1/reservations", "/v1/domains/rack/r2/hold"])
def test_a_body_that_is_not_json_is_named(shared, path):
    response = shared.post(path, data=b'{"replica": ', headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    problems = response.json()["problems"]
    assert len(problems) == 1
    assert problems[0].startswith("body: not valid JSON"), problems


def test_a_bad_hold_reason_and_unknown_names_are_refused(shared):
    for reason, problem in (
        ("", "reason: String should have at least 1 character"),
        ("   ", "reason: Value error, a reason is 1-512 characters, not 0"),
        ("two\nlines", "reason: Value error, a reason is one line of printable text"),
    ):
        assert_names(shared.post("/v1/domains/rack/r2/hold", {"reason": reason}), problem)
    assert_names(shared.post("/v1/domains/rack/r2/hold", {}), "reason: Field required")
    assert shared.domain("rack/r2")["held"] is None
    for path in ("/v1/domains/rack/nope/hold", "/v1/domains/shelf/r2/hold"):
        response = shared.post(path, HOLD)
        assert response.status_code == 404, response.text
    assert shared.get("/v1/headroom").status_code == 422
    response = shared.get("/v1/headroom?profile=nope")
    assert response.status_code == 404
    assert response.json()["detail"] == "no profile 'nope' in the facility file (profiles: big, p4)"


# --- reads ---------------------------------------------------------------------------------


def test_domains_show_budgets_loads_and_conditions(shared):
    body = shared.get("/v1/domains").json()
    assert body["missing"] == []
    domains = {f"{d['kind']}/{d['domain']}": d for d in body["domains"]}
    assert sorted(domains) == [
        "pdu/r1-a", "rack/r1", "rack/r2", "rack/r3", "rack/r4", "rack/r5", "row/1",
    ]  # fmt: skip
    assert domains["rack/r1"] == {
        "kind": "rack",
        "domain": "r1",
        "declared": True,
        "cap_watts": 10000.0,
        "limit_watts": 9000.0,
        "other_watts": 500.0,
        "reserved_watts": 0.0,
        "measured_watts": 3000.0,
        "load_watts": 3500.0,
        "load_basis": "measured",
        "room_watts": 5500.0,
        "headroom_watts": 6500.0,
        "condition": "ok",
        "reading_age_seconds": None,
        "held": None,
        "override": None,
        "evidence": None,
    }
    assert domains["rack/r3"]["condition"] == "hot"
    assert domains["rack/r3"]["reading_age_seconds"] == 12.0
    assert domains["rack/r4"]["headroom_watts"] == -1000.0
    assert domains["rack/r4"]["room_watts"] == -1500.0  # past its limit, 4.5 kW, as well
    row = domains["row/1"]
    assert (
        row["declared"], row["cap_watts"], row["limit_watts"], row["room_watts"],
        row["headroom_watts"],
    ) == (False, None, None, None, None)  # fmt: skip

    one = shared.get("/v1/domains/rack/r1").json()
    assert one["nodes"] == ["a1", "a2"]
    assert one["reservations"] == []
    assert one["missing"] == []
    assert {k: v for k, v in one.items() if k in domains["rack/r1"]} == domains["rack/r1"]
    assert shared.get("/v1/domains/row/1").json()["nodes"] == sorted(NODES)
    assert shared.get("/v1/domains/rack/nope").status_code == 404
    assert shared.get("/v1/domains/shelf/r1").status_code == 404


def test_headroom_counts_replicas_per_domain(shared):
    body = shared.get("/v1/headroom?profile=big").json()
    assert body["profile"] == "big"
    assert body["missing"] == []
    fits = {f"{d['kind']}/{d['domain']}": d for d in body["domains"]}
    # r1: 5,500 W of room → one 5 kW replica; r2: 16 kW of room, but 2 nodes of 8 GPUs.
    assert fits["rack/r1"]["fits"] == 1
    assert fits["rack/r2"]["fits"] == 2
    assert fits["rack/r3"]["fits"] == 0  # hot
    assert fits["rack/r3"]["binds"] == [{"reason": R3_HOT, "nodes": 1}]
    assert fits["rack/r4"]["fits"] == 0
    assert fits["rack/r5"]["fits"] == 1  # one node of 8 GPUs
    assert fits["rack/r5"]["binds"] == [{"reason": "GPUs: w1 has 0 free", "nodes": 1}]


def test_health_readiness_status_page_and_openapi(shared):
    assert shared.get("/healthz").json() == {"status": "ok"}
    assert shared.get("/readyz").json() == {
        "ready": True,
        "prometheus_up": True,
        "missing": [],
        "database": "ok",
    }
    page = shared.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "r1" in page.text and "enforce" in page.text

    document = shared.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    for path, methods in {
        "/v1/placements": {"post"},
        "/v1/reservations": {"get", "post"},
        "/v1/reservations/{reservation_id}": {"delete"},
        "/v1/reservations/{reservation_id}/confirm": {"post"},
        "/v1/headroom": {"get"},
        "/v1/domains": {"get"},
        "/v1/domains/{kind}/{name}": {"get"},
        "/v1/domains/{kind}/{name}/hold": {"post"},
        "/v1/domains/{kind}/{name}/release": {"post"},
        "/v1/profiles/{model}": {"get"},
        "/v1/power-capping": {"get"},
        "/-/reload": {"post"},
        "/healthz": {"get"},
        "/readyz": {"get"},
    }.items():
        assert methods <= set(paths.get(path, {})), path
    schemas = document["components"]["schemas"]
    assert {"model", "profile", "gpus"} <= set(schemas["Replica"]["required"])
    placement = paths["/v1/placements"]["post"]["responses"]["200"]
    assert placement["content"]["application/json"]["schema"]["$ref"].endswith("/PlacementResponse")


def test_readyz_waits_for_the_first_refresh(fake, make):
    fake.set("held")  # the first refresh hangs until released
    decider = make(ready=False, timeout="20s")
    response = decider.get("/readyz")
    assert response.status_code == 503
    assert response.json()["ready"] is False
    assert len(response.json()["missing"]) == len(PARTS)
    # Answers do not wait for it: every part is missing, nothing is refused for it.
    answer = decider.place(BIG, ["a1", "c1", "d1"])
    assert all(entry["allowed"] for entry in answer["nodes"])
    assert len(answer["missing"]) >= len(PARTS)
    fake.release()
    assert decider.wait_ready() == {
        "ready": True,
        "prometheus_up": True,
        "missing": [],
        "database": "ok",
    }


def test_readyz_with_prometheus_down(make, fake):
    fake.set("down")
    decider = make(fresh=False)
    body = decider.wait_ready()
    assert body["ready"] is True
    assert body["prometheus_up"] is False
    every_part = ["membership", "inventory", "measured", "conditions", "ages", "gpus", "limits"]
    every_part += ["min_limits"]
    every_part += ["profiles", "hot", "cpus", "evidence"]
    assert list(PARTS) == every_part
    assert len(body["missing"]) == len(every_part)
    for line, part in zip(body["missing"], every_part, strict=True):
        assert line.startswith(f"{PARTS[part]}: never read from Prometheus"), (part, line)
    metrics = decider.metrics()
    assert metric_value(metrics, "llmgw_decider_prometheus_up") == 0.0
    assert metric_value(metrics, "llmgw_decider_snapshot_age_seconds") is None


# --- reservations --------------------------------------------------------------------------


def test_reservation_lifecycle(decider):
    created = decider.reserve("r-1", "b1", BIG)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["id"] == "r-1"
    assert body["node"] == "b1"
    assert body["replica"] == {
        "model": "llama",
        "profile": "custom",
        "gpus": 4,
        "power_watts": 6000.0,
    }
    assert body["estimate_watts"] == 6000.0
    assert body["gpus"] == 4
    assert body["domains"] == ["rack/r2", "row/1"]
    assert body["confirmed"] is False
    assert body["confirmed_at"] is None
    assert body["expires_at"] == pytest.approx(body["created_at"] + 300)
    assert body["missing"] == []
    assert "would_refuse" not in body

    # Rack r2 now counts the reservation: max(reserved 6,000, measured 2,000).
    r2 = decider.domain("rack/r2")
    assert (r2["reserved_watts"], r2["load_watts"], r2["load_basis"]) == (
        6000.0,
        6000.0,
        "reserved",
    )
    assert r2["headroom_watts"] == 14000.0

    again = decider.reserve("r-1", "b1", BIG)
    assert again.status_code == 200, again.text
    assert {k: again.json()[k] for k in body if k != "missing"} == {
        k: v for k, v in body.items() if k != "missing"
    }

    for other in (("r-1", "b2", BIG), ("r-1", "b1", {**BIG, "power_watts": 5000})):
        conflict = decider.reserve(*other)
        assert conflict.status_code == 409, conflict.text
        assert conflict.json()["detail"] == (
            "reservation 'r-1' exists for node b1 with another replica or node; DELETE it first"
        )

    refused = decider.reserve("r-2", "a1", BIG)
    assert refused.status_code == 409
    assert refused.json()["reasons"] == [R1_POWER]
    assert refused.json()["detail"] == f"node a1 refused: {R1_POWER}"
    assert refused.json()["missing"] == []
    # Each refusal in its own words: hot, over its cap.
    assert decider.reserve("r-3", "c1", SMALL).json()["reasons"] == [R3_HOT]
    assert decider.reserve("r-4", "d1", SMALL).json()["reasons"] == [R4_OVER]

    listed = decider.get("/v1/reservations").json()["reservations"]
    assert [r["id"] for r in listed] == ["r-1"]
    assert decider.get("/v1/domains/rack/r2").json()["reservations"][0]["id"] == "r-1"

    confirmed = decider.post("/v1/reservations/r-1/confirm")
    assert confirmed.status_code == 200
    assert confirmed.json()["confirmed"] is True
    assert confirmed.json()["expires_at"] is None
    assert confirmed.json()["confirmed_at"] >= body["created_at"]
    assert decider.post("/v1/reservations/r-1/confirm").json() == confirmed.json()
    assert decider.post("/v1/reservations/nope/confirm").status_code == 404

    assert decider.delete("/v1/reservations/r-1").status_code == 204
    assert decider.delete("/v1/reservations/r-1").status_code == 404
    assert decider.get("/v1/reservations").json() == {"reservations": []}
    assert decider.domain("rack/r2")["reserved_watts"] == 0.0

    metrics = decider.metrics()
    allowed = {"call": "reservation", "outcome": "allowed"}
    refused_labels = {"call": "reservation", "outcome": "refused"}
    assert metric_value(metrics, "llmgw_decider_decisions_total", **allowed) == 1.0
    assert metric_value(metrics, "llmgw_decider_decisions_total", **refused_labels) == 3.0
    for rule in ("power_cap", "hot", "over_cap"):
        labels = {"call": "reservation", "rule": rule}
        assert metric_value(metrics, "llmgw_decider_refusals_total", **labels) == 1.0


# Ids keep to decider/names.py (tests/faults/test_http_faults.py: the ones refused).
@pytest.mark.parametrize("rid", ["team-a/llama-0", "x/confirm", "A:b_c.d-e/0"])
def test_every_allowed_reservation_id_can_be_confirmed_and_deleted(decider, rid):
    assert decider.reserve(rid, "b1", SMALL).status_code == 201
    path = f"/v1/reservations/{quote(rid, safe='/')}"
    confirmed = decider.post(f"{path}/confirm")
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["id"] == rid
    assert confirmed.json()["confirmed"] is True
    assert decider.delete(f"/v1/reservations/{quote(rid, safe='')}").status_code == 204
    assert decider.get("/v1/reservations").json() == {"reservations": []}


def test_reservations_fill_a_rack_and_refuse_past_its_margin(decider):
    """Rack r2: 18 kW limit, measured 2 kW. 6 kW replicas: three fit (reserved 18 kW)."""
    for index, node in enumerate(["b1", "b2", "b1"]):
        response = decider.reserve(f"fill-{index}", node, BIG)
        assert response.status_code == 201, response.text
    refused = decider.reserve("fill-3", "b2", {**BIG, "power_watts": 1})
    assert refused.status_code == 409
    assert refused.json()["reasons"] == [
        "rack r2: 18.0 of 20.0 kW reserved, replica needs ~0.0, margin 10%"
    ]
    answer = decider.place(SMALL, ["b1", "w1", "a1"])
    assert by_node(answer)["b1"]["allowed"] is False
    assert answer["order"] == ["a1", "w1"]


def test_observe_mode_reserves_and_says_what_it_would_refuse(make):
    decider = make(facility(mode="observe"))
    response = decider.reserve("r-o", "a1", BIG)
    assert response.status_code == 201, response.text
    assert response.json()["would_refuse"] == [R1_POWER]
    assert decider.domain("rack/r1")["reserved_watts"] == 6000.0
    labels = {"call": "reservation", "rule": "power_cap"}
    assert metric_value(decider.metrics(), "llmgw_decider_would_refuse_total", **labels) == 1.0


def test_an_unconfirmed_reservation_expires_and_a_confirmed_one_stays(make):
    decider = make(reservation_ttl="2s")
    # Made first, so its TTL ran out first: if confirming did not hold it, it goes first.
    assert decider.reserve("kept", "b1", SMALL).status_code == 201
    pending = decider.reserve("dropped", "b2", SMALL)
    assert pending.status_code == 201
    assert pending.json()["expires_at"] == pytest.approx(pending.json()["created_at"] + 2)
    assert decider.post("/v1/reservations/kept/confirm").status_code == 200

    poll(
        lambda: (
            [r["id"] for r in decider.get("/v1/reservations").json()["reservations"]] == ["kept"]
        ),
        "the unconfirmed reservation to expire",
    )
    assert decider.domain("rack/r2")["reserved_watts"] == 1000.0
    assert decider.delete("/v1/reservations/dropped").status_code == 404
    assert decider.post("/v1/reservations/dropped/confirm").status_code == 404
    metrics = decider.metrics()
    assert metric_value(metrics, "llmgw_decider_reservations", state="confirmed") == 1.0
    assert metric_value(metrics, "llmgw_decider_reservations", state="pending") == 0.0


# --- holds and metrics ---------------------------------------------------------------------


def test_a_hold_refuses_is_shown_and_survives_a_restart(decider):
    held = decider.post("/v1/domains/rack/r2/hold", {"reason": "  feed B maintenance  "})
    assert held.status_code == 200, held.text
    assert held.json()["held"]["reason"] == "feed B maintenance"
    since = held.json()["held"]["since"]

    answer = decider.place(SMALL, ["b1", "b2", "w1"])
    assert by_node(answer)["b1"]["reasons"] == ["rack r2 held: feed B maintenance"]
    assert answer["order"] == ["w1"]
    refused = decider.reserve("r-held", "b2", SMALL)
    assert refused.status_code == 409
    assert refused.json()["reasons"] == ["rack r2 held: feed B maintenance"]
    labels = {"kind": "rack", "domain": "r2"}
    assert metric_value(decider.metrics(), "llmgw_domain_held", **labels) == 1.0
    assert metric_value(decider.metrics(), "llmgw_domain_held", kind="rack", domain="r1") == 0.0

    decider.stop()
    decider.start(wait_ready=True)
    decider.wait_fresh()
    assert decider.domain("rack/r2")["held"] == {"reason": "feed B maintenance", "since": since}
    assert metric_value(decider.metrics(), "llmgw_domain_held", **labels) == 1.0
    assert by_node(decider.place(SMALL, ["b1"]))["b1"]["allowed"] is False

    released = decider.post("/v1/domains/rack/r2/release")
    assert released.status_code == 200
    assert released.json()["held"] is None
    assert decider.post("/v1/domains/rack/r2/release").status_code == 200  # idempotent
    assert metric_value(decider.metrics(), "llmgw_domain_held", **labels) == 0.0
    assert by_node(decider.place(SMALL, ["b1"]))["b1"]["allowed"] is True

    decider.stop()
    decider.start(wait_ready=True)
    assert decider.domain("rack/r2")["held"] is None


def test_holding_a_row_refuses_every_node_in_it(decider):
    response = decider.post("/v1/domains/row/1/hold", {"reason": "busway work"})
    assert response.status_code == 200
    answer = decider.place(SMALL, ["a1", "b1", "w1"])
    assert answer["order"] == []
    for entry in answer["nodes"]:
        assert entry["reasons"] == ["row 1 held: busway work"], entry
    assert answer["summary"] == "0/3 nodes allowed (3 held)"


def test_metrics_publish_budgets_reservations_headroom_and_freshness(decider):
    assert decider.reserve("m-1", "a1", {**SMALL, "power_watts": 2500}).status_code == 201
    decider.place(BIG, ["a1", "b1", "c1"])
    metrics = decider.metrics()

    def domain(name: str, key: str) -> float | None:
        kind, _, domain_ = key.partition("/")
        return metric_value(metrics, name, kind=kind, domain=domain_)

    assert domain("llmgw_domain_power_budget_watts", "rack/r1") == 10000.0
    assert domain("llmgw_domain_power_budget_watts", "pdu/r1-a") == 8000.0
    assert domain("llmgw_domain_power_budget_watts", "row/1") is None  # no budget
    assert domain("llmgw_domain_reserved_watts", "rack/r1") == 2500.0
    assert domain("llmgw_domain_reserved_watts", "pdu/r1-a") == 2500.0
    assert domain("llmgw_domain_reserved_watts", "row/1") == 2500.0
    # r1: cap 10,000 − (max(2,500 reserved, 3,000 measured) + 500 other).
    assert domain("llmgw_domain_headroom_watts", "rack/r1") == 6500.0
    # pdu r1-a: 8,000 − max(2,500 reserved, 1,000 measured).
    assert domain("llmgw_domain_headroom_watts", "pdu/r1-a") == 5500.0
    assert domain("llmgw_domain_headroom_watts", "rack/r4") == -1000.0
    assert domain("llmgw_domain_held", "rack/r1") == 0.0

    placement = {"call": "placement"}
    assert (
        metric_value(metrics, "llmgw_decider_decisions_total", **placement, outcome="allowed")
        == 1.0
    )
    assert (
        metric_value(metrics, "llmgw_decider_decisions_total", **placement, outcome="refused")
        == 2.0
    )
    assert (
        metric_value(metrics, "llmgw_decider_refusals_total", **placement, rule="power_cap") == 1.0
    )
    assert metric_value(metrics, "llmgw_decider_refusals_total", **placement, rule="hot") == 1.0
    assert metric_value(metrics, "llmgw_decider_refusals_total", **placement, rule="held") == 0.0
    assert metric_value(metrics, "llmgw_decider_prometheus_up") == 1.0
    age = metric_value(metrics, "llmgw_decider_snapshot_age_seconds")
    assert age is not None and 0 <= age < 30
    for part in ("membership", "measured", "limits"):
        assert metric_value(
            metrics, "llmgw_decider_snapshot_part_read_timestamp_seconds", part=part
        )
    assert metric_value(metrics, "llmgw_decider_reservations", state="pending") == 1.0
    assert "llmgw_decider_decisions_created" not in metrics


# --- reload --------------------------------------------------------------------------------


def reload_applied(decider: Decider) -> bool:
    return decider.domain("rack/r1")["cap_watts"] == 12000.0


def test_sighup_applies_a_good_facility_change(decider):
    decider.write_facility(
        facility(mode="observe", domains={**FACILITY["domains"], "rack/r1": {"cap_watts": 12000}})
    )
    decider.signal(signal.SIGHUP)
    poll(lambda: reload_applied(decider), f"the reload\n{decider.log_tail()}")
    answer = decider.place(BIG, ["a1", "c1"])
    assert answer["mode"] == "observe"
    assert all(entry["allowed"] for entry in answer["nodes"])
    # r1 now: 10.8 kW limit, 3 kW measured, no other_watts: 7.8 kW of room; pdu r1-a,
    # 6.2 kW, is the tightest now.
    assert by_node(answer)["a1"]["would_refuse"] == []
    assert by_node(answer)["a1"]["headroom_watts"] == 200.0
    assert by_node(answer)["c1"]["would_refuse"] == [R3_HOT]
    assert "reloaded" in decider.log()


BAD_FACILITY = """\
mode: enforce
defaults:
  margin: 2
domains:
  rack/r1: {cap_watts: -1}
  bogus: {}
profiles:
  p4: {gpus: 4}
"""


def assert_kept(decider: Decider) -> None:
    assert decider.running
    assert decider.domain("rack/r1")["cap_watts"] == 10000.0
    answer = decider.place(BIG, ["a1"])
    assert answer["mode"] == "enforce"
    assert by_node(answer)["a1"]["reasons"] == [R1_POWER]


def test_post_reload_applies_a_good_change_at_once(decider):
    decider.write_facility(
        facility(mode="observe", domains={**FACILITY["domains"], "rack/r1": {"cap_watts": 12000}})
    )
    response = decider.post("/-/reload")
    assert response.status_code == 200, response.text
    assert response.json() == {"detail": "reloaded"}
    assert reload_applied(decider)
    assert decider.place(BIG, ["a1"])["mode"] == "observe"


def test_post_reload_keeps_the_running_config_when_the_file_is_bad(decider):
    decider.write_facility(BAD_FACILITY)
    response = decider.post("/-/reload")
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["detail"] == "kept the running configuration"
    where = str(decider.facility_path)
    assert body["problems"] == [
        f"{where}:3: defaults.margin: Input should be less than 1",
        f"{where}:5: domains.rack/r1.cap_watts: Input should be greater than 0",
        f"{where}:6: domains.bogus.[key]: Value error, 'bogus' is not kind/name with kind "
        "one of site, room, row, rack, pdu",
    ]
    assert_kept(decider)

    # A good file afterwards is taken.
    decider.write_facility(facility(mode="observe"))
    assert decider.post("/-/reload").status_code == 200
    assert decider.place(BIG, ["a1"])["mode"] == "observe"


def test_sighup_keeps_the_running_config_when_the_file_is_bad(decider):
    decider.write_facility(BAD_FACILITY)
    decider.signal(signal.SIGHUP)
    poll(lambda: "reload refused" in decider.log(), "the reload to be refused")
    assert f"{decider.facility_path}:3: defaults.margin" in decider.log()
    assert_kept(decider)


def test_a_reload_with_a_bad_token_file_is_refused_whole(decider):
    (decider.directory / "decider.token").write_text("short\n")
    decider.write_facility(facility(mode="observe"))
    response = decider.post("/-/reload")
    assert response.status_code == 400
    assert response.json()["problems"] == [
        f"{decider.directory / 'decider.token'}:1: the token must be one line of at least "
        "16 ASCII characters"
    ]
    assert decider.place(BIG, ["a1"])["mode"] == "enforce", "half a reload was applied"
    assert decider.post("/-/reload", token="short").status_code == 401


def test_a_bad_file_at_start_exits_2_naming_the_line(tmp_path, fake):
    (tmp_path / "facility.yaml").write_text(BAD_FACILITY)
    config = decider_yaml(fake.url, listen="127.0.0.1:1", token=False)
    (tmp_path / "decider.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "decider.main", "--config", str(tmp_path / "decider.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    where = tmp_path / "facility.yaml"
    assert f"{where}:3: defaults.margin: Input should be less than 1" in result.stderr
    assert f"{where}:5: domains.rack/r1.cap_watts: Input should be greater than 0" in result.stderr
