"""The power cap that would bring a domain back under its target (decider.power_capping):
every figure worked out by hand in the comments; then a property over generated GPU sets,
and GET /v1/power-capping through a running decider (tests/decider_harness.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decider.capping.driver import class_minimum
from decider.config import Staleness
from decider.facility import DomainRef, Facility
from decider.placement.predicted_peak import min_gpu_limit
from decider.placement.view import View
from decider.power_capping import interpolate, limit_for, recommend, recommendations, saving
from decider.snapshot import PARTS, Part, Snapshot
from decider.store import Reservation
from tests.decider_harness import Decider, FakePrometheus, Readings

NOW = 1_700_000_000.0
STALENESS = Staleness(readings=120.0, inventory=3600.0)
R1, R2 = DomainRef("rack", "r1"), DomainRef("rack", "r2")
#: A power-limit sweep of an 8-GPU replica: watts per GPU → tokens per second.
SWEEP = {700: 6000.0, 500: 5200.0, 400: 4400.0}


def make_view(
    *,
    domains: Mapping[str, Any],
    membership: Mapping[str, Iterable[DomainRef]],
    gpus: Mapping[str, int],
    limits: Mapping[str, float],
    measured: Mapping[DomainRef, float] | None = None,
    conditions: Mapping[DomainRef, str] | None = None,
    reservations: Iterable[Reservation] = (),
    min_limits: Mapping[str, float] | None = None,
) -> View:
    facility = Facility.model_validate(
        {
            "mode": "enforce",
            "domains": dict(domains),
            "profiles": {
                "swept-tp8": {"gpus": 8, "tokens_per_second_at_gpu_limit": SWEEP},
                "plain-tp8": {"gpus": 8},
            },
        }
    )
    snapshot = Snapshot(
        membership={node: tuple(refs) for node, refs in membership.items()},
        domains=frozenset(ref for refs in membership.values() for ref in refs),
        measured_watts=dict(measured or {}),
        conditions=dict(conditions or {}),  # type: ignore[arg-type]
        node_gpus=dict(gpus),
        gpu_limit_watts=dict(limits),
        gpu_min_limit_watts=dict(min_limits or {}),
        parts={name: Part(NOW) for name in PARTS},
        prometheus_up=True,
    )
    fresh, missing = snapshot.fresh_parts(NOW, STALENESS.readings, STALENESS.inventory)
    held = {r.id: r for r in reservations}
    return View(facility, snapshot, NOW, fresh, missing, held, {})


def reservation(rid: str, node: str, profile: str, domains: tuple[DomainRef, ...]) -> Reservation:
    return Reservation(
        id=rid,
        node=node,
        replica={"model": "llama", "profile": profile, "gpus": 8},
        estimate_watts=4000.0,  # two in a rack: 8 000 W reserved, under what is measured
        gpus=8,
        domains=domains,
        created_at=NOW,
        expires_at=None,
        confirmed_at=NOW,
    )


def test_an_over_budget_rack_gets_the_highest_limit_that_brings_it_under():
    # Cap 20 000 W, margin 10 %: target 18 000 W. Load 20 500 measured + 500 other = 21 000:
    # 3 000 W to shed from 16 GPUs at 700 W: 700 − 3 000/16 = 512.5 → 512 W, which saves
    # 16 × 188 = 3 008 W. n3's limit is unknown: left out and named.
    view = make_view(
        domains={"rack/r1": {"cap_watts": 20_000, "other_watts": 500}},
        membership={"n1": [R1], "n2": [R1], "n3": [R1]},
        gpus={"n1": 8, "n2": 8, "n3": 8},
        limits={"n1": 700.0, "n2": 700.0},
        measured={R1: 20_500.0},
    )
    rec = recommend(view, R1)
    assert rec is not None
    body = rec.as_json()
    assert (body["why"], body["load_watts"], body["target_watts"], body["reduce_watts"]) == (
        ["over_budget"],
        21_000.0,
        18_000.0,
        3_000.0,
    )
    assert (body["gpus"], body["nodes"], body["unknown_nodes"]) == (16, ["n1", "n2"], ["n3"])
    assert (body["current_gpu_limit_watts"], body["gpu_limit_watts"]) == (700.0, 512.0)
    assert body["saving_watts"] == 3_008.0 and not body["below_card_minimum"]
    assert body["actuated"] is False
    assert body["throughput_cost_tokens_per_second"] is None
    assert body["reason"] == (
        "rack r1 over its budget: 21.0 kW measured (incl. 0.5 other), target 18.0 kW (−3.0): cap "
        "its 16 GPUs at 512 W (now up to 700 W), saving up to 3.0 kW; 1 node(s) left out, GPU "
        "count or limit unknown: n3; throughput cost unknown: no replica reserved in it"
    )


def test_mixed_limits_are_capped_to_one_limit_across_the_domain():
    # 8 GPUs at 700 W and 8 at 450 W, 3 000 W to shed. Down to 450 W only the 700 W cards
    # save: 8 × 250 = 2 000 W; the last 1 000 W from all 16: 450 − 1 000/16 = 387.5 → 387 W,
    # saving 8 × 313 + 8 × 63 = 3 008 W.
    gpus = [(8, 700.0), (8, 450.0)]
    assert limit_for(gpus, 3_000) == 387.0
    assert saving(gpus, 387) == 3_008.0
    assert limit_for(gpus, 2_000) == 450.0
    assert limit_for(gpus, 8 * 700 + 8 * 450 + 1) is None  # more than capping to 0 W saves


def test_a_warm_rack_is_brought_10_percent_down_with_the_throughput_it_costs():
    # Warm, no budget, 10 000 W measured: target 9 000 W, 1 000 W from 8 GPUs at 700 W:
    # 700 − 125 = 575 W. The swept replica: 6 000 tokens/s at 700 W; at 575 W, between the
    # 500 and 700 W points, 5 200 + 800 × 75/200 = 5 500: costs 500 tokens/s. The other
    # replica's profile has no sweep: unknown, not guessed.
    view = make_view(
        domains={},
        membership={"n4": [R2], "n5": [R2]},
        gpus={"n4": 8, "n5": 0},
        limits={"n4": 700.0, "n5": 700.0},
        measured={R2: 10_000.0},
        conditions={R2: "warm"},
        reservations=[
            reservation("a", "n4", "swept-tp8", (R2,)),
            reservation("b", "n4", "plain-tp8", (R2,)),
            reservation("elsewhere", "n1", "swept-tp8", (R1,)),
        ],
    )
    rec = recommend(view, R2)
    assert rec is not None
    body = rec.as_json()
    assert (body["why"], body["target_watts"], body["gpu_limit_watts"]) == (["warm"], 9000, 575)
    assert body["throughput_cost_tokens_per_second"] == 500.0
    assert [(t["reservation"], t["tokens_per_second_capped"]) for t in body["throughput"]] == [
        ("a", 5500.0),
        ("b", None),
    ]
    assert body["throughput"][1]["note"] == (
        "no measured throughput at power limits for profile plain-tp8"
    )
    assert body["reason"].endswith(
        "cap its 8 GPUs at 575 W (now up to 700 W), saving up to 1.0 kW; costs 500 tokens/s "
        "over 1 of 2 reserved replicas; throughput cost unknown for 1 replica(s)"
    )


def test_a_domain_capping_cannot_save_enough_is_told_to_move_load():
    # Cap 5 000 W: target 4 500 W, load 9 000 W: 4 500 W to shed, but 8 GPUs at 400 W save
    # at most 3 200 W even at 0 W.
    view = make_view(
        domains={"rack/r1": {"cap_watts": 5_000}},
        membership={"n1": [R1]},
        gpus={"n1": 8},
        limits={"n1": 400.0},
        measured={R1: 9_000.0},
    )
    rec = recommend(view, R1)
    assert rec is not None and rec.gpu_limit_watts is None
    assert rec.reason.endswith(
        "capping its 8 GPUs cannot save that much (at most 3.2 kW even at 0 W); move load"
    )


def test_a_limit_below_what_cards_take_says_so():
    # Hot, load 20 000 W measured, cap 16 000: target min(18 000, 14 400) = 14 400 W, 5 600 W
    # from 8 GPUs at 700 W: 700 − 700 = 0 W, below 30 % of 700 W.
    view = make_view(
        domains={"rack/r1": {"cap_watts": 16_000}},
        membership={"n1": [R1]},
        gpus={"n1": 8},
        limits={"n1": 700.0},
        measured={R1: 20_000.0},
        conditions={R1: "hot"},
    )
    rec = recommend(view, R1)
    assert rec is not None
    assert rec.why == ("over_budget", "hot") and rec.target_watts == 14_400.0
    assert rec.gpu_limit_watts == 0.0 and rec.below_card_minimum
    assert "most cards refuse it: move load instead" in rec.reason


def test_a_limit_below_the_cards_published_minimum_says_so():
    # Over budget: 20 000 W measured, cap 20 000 x (1 - 0.1): 2 000 W off 8 GPUs at 700 W:
    # 450 W. Above 30 % of 700 W (210 W), but n1's cards publish a minimum of 600 W (a T4's
    # is 86 % of its limit): they would refuse it.
    args: dict[str, Any] = {
        "domains": {"rack/r1": {"cap_watts": 20_000}},
        "membership": {"n1": [R1], "n2": [R1]},
        "gpus": {"n1": 8, "n2": 0},
        "limits": {"n1": 700.0, "n2": 700.0},
        "measured": {R1: 20_000.0},
    }
    rec = recommend(make_view(**args, min_limits={"n1": 600.0}), R1)
    assert rec is not None and rec.gpu_limit_watts == 450.0
    body = rec.as_json()
    assert body["below_card_minimum"] and body["card_minimum_read"]
    assert body["card_minimum_watts"] == 600.0
    assert rec.reason.endswith(
        "below the cards' minimum limit, 600 W, the cards refuse it: move load instead; "
        "throughput cost unknown: no replica reserved in it"
    )
    estimated = recommend(make_view(**args), R1)  # none published: the 30 % estimate passes it
    assert estimated is not None and not estimated.below_card_minimum
    assert (estimated.card_minimum_watts, estimated.card_minimum_read) == (210.0, False)


def test_a_mixed_domain_takes_the_estimate_where_it_is_the_larger():
    # n1 publishes 150 W for its 700-W cards, n2 (an older exporter) nothing: 30 % of its
    # 700 W, 210 W, stands for it, and one limit on both must suit n2's cards too. The
    # 20 000 W over 18 000 W target (cap x 0.9) is 2 000 W off 16 GPUs at 700 W: 575 W.
    args: dict[str, Any] = {
        "domains": {"rack/r1": {"cap_watts": 20_000}},
        "membership": {"n1": [R1], "n2": [R1]},
        "gpus": {"n1": 8, "n2": 8},
        "limits": {"n1": 700.0, "n2": 700.0},
        "measured": {R1: 20_000.0},
    }
    rec = recommend(make_view(**args, min_limits={"n1": 150.0}), R1)
    assert rec is not None and rec.gpu_limit_watts == 575.0
    assert (rec.card_minimum_watts, rec.card_minimum_read) == (210.0, False)
    rec = recommend(make_view(**args, min_limits={"n1": 600.0}), R1)  # the read one larger
    assert rec is not None and rec.below_card_minimum
    assert (rec.card_minimum_watts, rec.card_minimum_read) == (600.0, True)


nodes_with_cards = st.lists(
    st.tuples(
        st.sampled_from([70.0, 300.0, 350.0, 450.0, 700.0, 1_000.0]),
        st.none() | st.sampled_from([60.0, 100.0, 150.0, 200.0, 500.0]),
    ),
    min_size=1,
    max_size=6,
)


@given(nodes=nodes_with_cards)
def test_the_ladder_admission_and_advice_take_the_same_card_minimum(
    nodes: list[tuple[float, float | None]],
) -> None:
    """decider.card_minimum is the one rule: the ladder's class minimum, admission's lowest
    limit and the advisory's card minimum give the same figure on any mix of nodes that
    publish their cards' range and nodes that do not."""
    names = [f"n{i}" for i in range(len(nodes))]
    ladder, _ = class_minimum([(8, limit, minimum) for limit, minimum in nodes])
    admission, _ = min_gpu_limit(nodes, None)
    view = make_view(
        domains={"rack/r1": {"cap_watts": 1_000}},  # over budget: always a recommendation
        membership={name: [R1] for name in names},
        gpus=dict.fromkeys(names, 8),
        limits={name: limit for name, (limit, _) in zip(names, nodes, strict=True)},
        measured={R1: 100_000.0},
        min_limits={
            name: minimum
            for name, (_, minimum) in zip(names, nodes, strict=True)
            if minimum is not None
        },
    )
    advice = recommend(view, R1)
    assert advice is not None
    assert ladder == admission == advice.card_minimum_watts


def test_a_domain_within_budget_and_ok_needs_nothing():
    view = make_view(
        domains={"rack/r1": {"cap_watts": 20_000}},
        membership={"n1": [R1]},
        gpus={"n1": 8},
        limits={"n1": 700.0},
        measured={R1: 17_999.0},
        conditions={R1: "ok"},
    )
    assert recommend(view, R1) is None
    assert recommendations(view) == []


def test_throughput_is_never_extrapolated_past_the_sweep():
    assert interpolate(SWEEP, 450) == 4800.0  # 4 400 + 800 × 50/100
    assert interpolate(SWEEP, 700) == 6000.0
    assert interpolate(SWEEP, 350) is None and interpolate(SWEEP, 750) is None
    assert interpolate({}, 500) is None


@given(
    st.lists(
        st.tuples(st.integers(1, 16), st.integers(50, 1000).map(float)), min_size=1, max_size=8
    ),
    st.floats(0.001, 1.0),
)
def test_the_limit_is_the_highest_whole_watt_that_saves_enough(
    gpus: list[tuple[int, float]], share: float
):
    reduce_watts = saving(gpus, 0.0) * share
    limit = limit_for(gpus, reduce_watts)
    assert limit is not None and 0 <= limit <= max(current for _, current in gpus)
    assert limit == int(limit)
    assert saving(gpus, limit) >= reduce_watts - 1e-6
    if limit + 1 <= max(current for _, current in gpus):
        assert saving(gpus, limit + 1) < reduce_watts


def test_the_api_shows_the_recommendations(tmp_path: Path):
    fake = FakePrometheus(
        Readings(
            membership={"n1": ["rack/r1"], "n2": ["rack/r2"]},
            measured={"rack/r1": 20_500.0, "rack/r2": 1_000.0},
            conditions={"rack/r1": "ok", "rack/r2": "ok"},
            gpus={"n1": 8, "n2": 8},
            limits={"n1": 700.0, "n2": 700.0},
        )
    )
    decider = Decider(
        tmp_path / "decider",
        fake.url,
        {"mode": "enforce", "domains": {"rack/r1": {"cap_watts": 20_000}}},
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        body = decider.get("/v1/power-capping").json()
        assert body["actuated"] is False
        # 20 500 − 18 000 = 2 500 W from 8 GPUs at 700 W: 700 − 312.5 → 387 W.
        assert [(r["domain"], r["gpu_limit_watts"]) for r in body["recommendations"]] == [
            ("r1", 387.0)
        ]
        one = decider.get("/v1/power-capping", params={"domain": "rack/r2"}).json()
        assert one["recommendations"] == []
        missing = decider.get("/v1/power-capping", params={"domain": "rack/nope"})
        assert missing.status_code == 404 and "no domain rack/nope" in missing.json()["detail"]
    finally:
        decider.close()
        fake.close()


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_a_reason_names_the_domain_and_its_figures(share: float):
    view = make_view(
        domains={"rack/r1": {"cap_watts": 10_000}},
        membership={"n1": [R1]},
        gpus={"n1": 8},
        limits={"n1": 700.0},
        measured={R1: 9_000.0 + 1_000.0 * share},
    )
    rec = recommend(view, R1)
    assert rec is not None and rec.reason.startswith("rack r1 over its budget: ")
    assert f"target {9_000 / 1000:.1f} kW" in rec.reason
