"""The capping ladder on a real decider (decider.capping.driver, decider/api/capping.py): a
fake Prometheus drives an oversubscribed rack's measured power up past each threshold and
back down, a feed is lost, and the node agents' leases answer through the real HTTP API.

The rack: feeds of 10 kW x derating 0.9, no margin: a 9 kW budget. Four nodes of 4 GPUs at
700 W (11.2 kW at their limits: oversubscribed), no node share: n1, n2 run batch replicas,
n3, n4 interactive ones. Hold 2 s, so that a release is seen within a test's time.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decider.capping.driver import class_minimum
from tests.decider_harness import Decider, FakePrometheus, Readings, metric_value, poll

pytestmark = pytest.mark.servers

HOLD_S = 2.0
RACK = ["rack/r1", "pdu/r1-a", "pdu/r1-b"]
NODES = ("n1", "n2", "n3", "n4")

FACILITY: dict[str, Any] = {
    "mode": "observe",
    "defaults": {"margin": 0.0, "derating": 0.9},
    "node_share_watts": 0,
    "classes": ["batch", "interactive"],
    "models": {"small": {"class": "batch"}, "large": {"class": "interactive"}},
    "oversubscription": {
        "ladder": {
            "first_threshold": 0.90,
            "second_threshold": 0.97,
            "release_margin": 0.05,
            "hold": f"{HOLD_S:g}s",
        },
        "lease": "30s",
    },
    "domains": {
        "rack/r1": {
            "feeds": [
                {"pdu": "r1-a", "rating_watts": 10000},
                {"pdu": "r1-b", "rating_watts": 10000},
            ],
            "oversubscribe": True,
        },
        "rack/r2": {"cap_watts": 20000},
        # n1's row, oversubscribed too and tighter: where two domains cap a node, the
        # lowest cap wins (set per test).
        "row/w1": {"cap_watts": 50000, "oversubscribe": True},
    },
}


def readings() -> Readings:
    return Readings(
        membership={node: [*RACK, "row/w1"] for node in NODES} | {"n9": ["rack/r2"]},
        inventory=["rack/r1", "rack/r2", "row/w1", "pdu/r1-a", "pdu/r1-b"],
        conditions={"rack/r1": "ok", "rack/r2": "ok", "row/w1": "ok"},
        measured={"rack/r1": 6000.0, "pdu/r1-a": 3000.0, "pdu/r1-b": 3000.0, "row/w1": 6000.0},
        gpus=dict.fromkeys([*NODES, "n9"], 4),
        limits=dict.fromkeys([*NODES, "n9"], 700.0),
    )


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[FakePrometheus, Decider]]:
    fake = FakePrometheus(readings())
    decider = Decider(tmp_path / "decider", fake.url, FACILITY)
    try:
        decider.start(wait_ready=True)
        poll(lambda: capping(decider)["domains"], "the first ladder")
        for rid, node, model in (
            ("b1", "n1", "small"),
            ("b2", "n2", "small"),
            ("i1", "n3", "large"),
            ("i2", "n4", "large"),
        ):
            replica = {"model": model, "profile": "p", "gpus": 4, "power_watts": 2800}
            answer = decider.reserve(rid, node, replica)
            assert answer.status_code == 201, answer.text
        yield fake, decider
    finally:
        decider.close()
        fake.close()


def capping(decider: Decider) -> dict[str, Any]:
    answer = decider.get("/v1/capping")
    assert answer.status_code == 200, answer.text
    return answer.json()


def rack(decider: Decider) -> dict[str, Any]:
    (entry,) = [d for d in capping(decider)["domains"] if d["domain"] == "r1"]
    return entry


def wait_rack(decider: Decider, check: Any, what: str) -> dict[str, Any]:
    def look() -> dict[str, Any] | None:
        entry = rack(decider)
        return entry if check(entry) else None

    return poll(look, what)


def lease(decider: Decider, node: str) -> dict[str, Any]:
    answer = decider.get(f"/v1/capping/leases/{node}", headers=decider.headers())
    assert answer.status_code == 200, answer.text
    return answer.json()


def cli_output(decider: Decider, *args: str) -> str:
    from llmgw_facility import cli

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli.main([*args, "--decider", decider.url]) == 0
    return out.getvalue()


def set_power(fake: FakePrometheus, watts: float) -> None:
    fake.readings.measured = fake.readings.measured | {
        "rack/r1": watts,
        "pdu/r1-a": watts / 2,
        "pdu/r1-b": watts / 2,
    }


def test_the_ladder_caps_each_class_in_turn_and_releases_after_hold(site):
    fake, decider = site
    entry = wait_rack(decider, lambda e: e["nodes"] == list(NODES), "the rack's nodes")
    assert (entry["step"], entry["caps"], entry["budget_watts"]) == (0, {}, 9000.0)
    # 16 GPUs x L <= 9 kW: 562 W, the safe limit every lease carries
    assert entry["safe_gpu_limit_watts"] == 562.0
    first = lease(decider, "n1")
    assert (first["gpu_limit_watts"], first["safe_gpu_limit_watts"]) == (None, 562.0)
    assert (first["lease_seconds"], first["domains"]) == (30.0, ["rack/r1", "row/w1"])

    # past the first threshold (8.1 kW): the batch class alone, to a worst case of 8.1 kW:
    # 8 x 700 + 8 x c <= 8100 -> c = 312 W
    set_power(fake, 8300.0)
    entry = wait_rack(decider, lambda e: e["step"] == 1, "step 1")
    assert entry["caps"] == {"batch": 312.0}
    assert entry["reason"].startswith("rack r1: 8.3 kW of 9.0 kW budget (0.92) > first threshold")
    leased = lease(decider, "n1")["gpu_limit_watts"]
    assert leased == 312.0 and isinstance(leased, float)  # "312.0": a strict client's float
    assert lease(decider, "n3")["gpu_limit_watts"] is None
    text = decider.metrics()
    assert metric_value(text, "llmgw_decider_capping_step", kind="rack", domain="r1") == 1
    labels = {"kind": "rack", "domain": "r1", "class": "batch"}
    assert metric_value(text, "llmgw_decider_capping_gpu_limit_watts", **labels) == 312.0

    page = decider.get("/").text
    assert 'id="capping-rack-r1"' in page and "batch 312 W" in page
    assert cli_output(decider, "capping").splitlines()[0] == "2 oversubscribed domain(s), 1 capped"
    assert "rack/r1  " in cli_output(decider, "capping")
    assert "node n1: 312 W per GPU for 30 s, then the safe limit 562 W" in cli_output(
        decider, "capping", "--node", "n1", "--token-file", str(decider.directory / "decider.token")
    )

    # past the second (8.73 kW): every class; the measured excess (8.8 - 8.1 kW) spread
    # over the 16 GPUs from the step-1 caps: interactive 700 - 700 / 8 = 612 W
    set_power(fake, 8800.0)
    entry = wait_rack(decider, lambda e: e["step"] == 2, "step 2")
    assert entry["caps"] == {"batch": 312.0, "interactive": 612.0}
    assert lease(decider, "n3")["gpu_limit_watts"] == 612.0

    # back down below both release lines, and low enough that what each release lifts
    # (interactive's 8 x 88 W, then batch's 8 x 388 W: 3.1 kW at most) would not take the
    # rack past its 9 kW cap (at 6 kW, step 1 would hold): step 2 holds for HOLD_S, then
    # one step at a time
    set_power(fake, 5000.0)
    dropped = time.monotonic()
    entry = wait_rack(decider, lambda e: e["step"] < 2, "the release of step 2")
    assert time.monotonic() - dropped >= HOLD_S
    assert entry["step"] == 1 and set(entry["caps"]) == {"batch"}
    released = time.monotonic()
    entry = wait_rack(decider, lambda e: e["step"] == 0, "the release of step 1")
    assert time.monotonic() - released >= HOLD_S - 0.5  # its hold began at that refresh
    assert entry["caps"] == {}
    assert lease(decider, "n1")["gpu_limit_watts"] is None


def test_a_lost_feed_caps_to_the_survivor(site):
    fake, decider = site
    wait_rack(decider, lambda e: e["nodes"] == list(NODES), "the rack's nodes")
    # r1-b reads nothing while r1-a carries it all: r1-a alone, 9 kW, must carry the worst
    # case (11.2 kW): batch to 700 - 2200 / 8 = 425 W, whatever the measured power says
    fake.readings.measured = fake.readings.measured | {"pdu/r1-a": 6000.0, "pdu/r1-b": 0.0}
    entry = wait_rack(decider, lambda e: e["lost_feed"] is not None, "the lost feed")
    assert entry["lost_feed"] == {"pdus": ["r1-b"], "survivor_watts": 9000.0}
    assert (entry["step"], entry["caps"]) == (1, {"batch": 425.0})
    assert "feed r1-b lost" in entry["reason"]
    assert lease(decider, "n2")["gpu_limit_watts"] == 425.0
    text = decider.metrics()
    assert metric_value(text, "llmgw_decider_capping_feed_lost", kind="rack", domain="r1") == 1


def test_leases_need_the_token_and_an_oversubscribed_domain_and_the_lowest_cap_wins(site):
    fake, decider = site
    wait_rack(decider, lambda e: e["nodes"] == list(NODES), "the rack's nodes")
    unauthenticated = decider.get("/v1/capping/leases/n1")
    assert unauthenticated.status_code == 401
    wrong = decider.get("/v1/capping/leases/n1", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    absent = decider.get("/v1/capping/leases/n9", headers=decider.headers())
    assert absent.status_code == 404
    assert absent.json() == {"error": "node n9 is in no oversubscribed domain"}

    # the rack at step 1 (batch 312 W); the row (a 10 kW budget) at 9.8 kW, step 2: batch to
    # 700 - 2200 / 8 = 425 W, then the measured 0.8 kW over its 9 kW target off interactive:
    # 600 W
    row = {"cap_watts": 10000, "oversubscribe": True}
    facility = {**FACILITY, "domains": {**FACILITY["domains"], "row/w1": row}}
    decider.write_facility(facility)
    assert decider.post("/-/reload").status_code == 200
    set_power(fake, 8300.0)
    fake.readings.measured = fake.readings.measured | {"row/w1": 9800.0}

    def both() -> dict[str, Any] | None:
        found = {d["domain"]: d for d in capping(decider)["domains"]}
        return found if found["r1"]["step"] == 1 and found["w1"]["step"] == 2 else None

    found = poll(both, "the rack at step 1, the row at step 2")
    assert found["r1"]["caps"] == {"batch": 312.0}
    assert found["w1"]["caps"] == {"batch": 425.0, "interactive": 600.0}
    n1, n3 = lease(decider, "n1"), lease(decider, "n3")
    assert (n1["gpu_limit_watts"], n3["gpu_limit_watts"]) == (312.0, 600.0)  # the lowest
    # the lowest safe limit: the rack's 9 kW / 16 GPUs = 562 W, the row's 10 kW / 16 = 625 W
    assert (n1["safe_gpu_limit_watts"], found["w1"]["safe_gpu_limit_watts"]) == (562.0, 625.0)
    assert "rack/r1 at step 1" in n1["reason"] and "row/w1 at step 2" in n1["reason"]


def test_a_domain_the_decider_cannot_see_gets_its_safe_limits(site):
    """No measured power for the rack (a rule's output gone): the ladder holds its step and
    every lease gives the lower of its cap and the safe limit."""
    fake, decider = site
    wait_rack(decider, lambda e: e["nodes"] == list(NODES), "the rack's nodes")
    assert lease(decider, "n3")["gpu_limit_watts"] is None
    fake.readings.measured = {k: v for k, v in fake.readings.measured.items() if k != "rack/r1"}
    entry = wait_rack(decider, lambda e: e["blind"] is not None, "the rack unseen")
    assert entry["blind"].startswith("no fresh measured power")
    assert entry["step"] == 0 and entry["power_watts"] is None
    n3 = lease(decider, "n3")
    assert (n3["gpu_limit_watts"], n3["safe_gpu_limit_watts"]) == (562.0, 562.0)
    assert "no fresh measured power" in n3["reason"]
    text = decider.metrics()
    assert metric_value(text, "llmgw_decider_capping_blind", kind="rack", domain="r1") == 1


def test_before_it_knows_the_membership_the_decider_answers_503(tmp_path: Path):
    """A decider started while Prometheus is down can say neither a lease nor that there is
    none: 503, so that an agent keeps its lease and then its safe limit (never a 404, which
    would uncap it)."""
    fake = FakePrometheus(readings())
    decider = Decider(tmp_path / "decider", fake.url, FACILITY)
    try:
        fake.down()
        decider.start()
        answer = decider.get("/v1/capping/leases/n1", headers=decider.headers())
        assert answer.status_code == 503, answer.text
        assert "not yet read which domains" in answer.json()["error"]
        fake.up()
        poll(
            lambda: (
                decider.get("/v1/capping/leases/n1", headers=decider.headers()).status_code == 200
            ),
            "a lease once Prometheus answers",
        )
    finally:
        decider.close()
        fake.close()


def test_a_class_is_never_capped_below_its_cards_published_minimum(site):
    """n1 and n2 (batch) publish a card minimum of 420 W, 60 % of their 700 W limit (an A100
    PCIe's is 150 of 250 W, a T4's 60 of 70 W): step 1 would take batch to 312 W, which those
    cards refuse, so the ladder stops at 420 W. n3 and n4 publish none: their class's minimum
    is the estimate, 30 % of 700 W, and the API says it is one."""
    fake, decider = site
    fake.readings.min_limits = {"n1": 420.0, "n2": 420.0}

    def classes(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {group["class"]: group for group in entry["classes"]}

    entry = wait_rack(
        decider,
        lambda e: classes(e).get("batch", {}).get("min_limit_watts") == 420.0,
        "the batch cards' minimum read",
    )
    batch, interactive = classes(entry)["batch"], classes(entry)["interactive"]
    assert batch["min_limit_from"] == (
        "read: the cards' minimum limit (llmgw_gpu_power_limit_min_watts)"
    )
    assert interactive["min_limit_watts"] == 210.0
    assert interactive["min_limit_from"] == (
        "estimated: 30% of the GPU limit (no card minimum published)"
    )

    set_power(fake, 8300.0)
    entry = wait_rack(decider, lambda e: e["step"] == 1, "step 1")
    assert entry["caps"] == {"batch": 420.0}
    assert lease(decider, "n1")["gpu_limit_watts"] == 420.0
    set_power(fake, 8800.0)  # step 2 spreads the rest over interactive: batch stays at 420 W
    entry = wait_rack(decider, lambda e: e["step"] == 2, "step 2")
    assert entry["caps"]["batch"] == 420.0 and entry["caps"]["interactive"] < 700.0
    assert lease(decider, "n2")["gpu_limit_watts"] == 420.0


def test_a_class_minimum_read_on_some_nodes_and_estimated_on_others_is_the_larger():
    read_one = [(4, 700.0, 200.0), (4, 700.0, None)]  # an H100 read, one of an older exporter
    assert class_minimum(read_one) == (
        210.0,
        "estimated: the cards' minimum read on 1 of 2 nodes, 30% of the GPU limit (no card "
        "minimum published) on the other 1",
    )
    t4_beside = [(4, 70.0, 60.0), (4, 700.0, None)]  # a T4 node's 60 W is below 210 W too
    assert class_minimum(t4_beside)[0] == 210.0
    assert class_minimum([(4, 700.0, 420.0), (4, 700.0, None)])[1].startswith("read: ")
