"""A model's profiles ranked by tokens per joule (decider.profiles), and placement with
alternative profiles (decider.placement.profile_choice): on views built by hand, then
through a running decider reading the fake Prometheus (tests/decider_harness.py).

Figures: ML.ENERGY v3 (tests/fixtures/mlenergy/README.md), Llama-3.3-70B-Instruct at
batch 512: 2×B200 3.667 tokens/J, 7078.6 tokens/s, 1930.1 W; 4×H100 2.352 tokens/J,
5858.5 tokens/s, 2490.5 W.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decider.config import Staleness
from decider.facility import DomainRef, Facility
from decider.models import PlacementRequest
from decider.placement import profile_choice
from decider.placement.view import View
from decider.profiles import answer, standings
from decider.snapshot import PARTS, Part, ProfileFigures, Snapshot
from tests.decider_harness import Decider, FakePrometheus, Readings

NOW = 1_700_000_000.0
STALENESS = Staleness(readings=120.0, inventory=3600.0)
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
B200 = ProfileFigures(3.667, 7078.6, 1930.1, 1, NOW)
H100 = ProfileFigures(2.352, 2 * 5858.5, 2 * 2490.5, 2, NOW)
NODE_SHARE_W = 400.0


def make_facility(mode: str = "enforce", **profiles: Any) -> Facility:
    return Facility.model_validate(
        {
            "mode": mode,
            "domains": {"rack/r1": {"cap_watts": 10_000}},
            "node_share_watts": NODE_SHARE_W,
            "profiles": {
                "h100-tp8": {"gpus": 8, "models": [MODEL]},
                "b200-tp2": {"gpus": 2},
                **profiles,
            },
        }
    )


def make_view(
    profiles: Mapping[tuple[str, str], ProfileFigures],
    *,
    facility: Facility | None = None,
    now: float = NOW,
    profiles_read_at: float = NOW,
) -> View:
    snapshot = Snapshot(
        membership={"n1": (DomainRef("rack", "r1"),), "n2": (DomainRef("rack", "r1"),)},
        domains=frozenset({DomainRef("rack", "r1")}),
        node_gpus={"n1": 8, "n2": 8},
        gpu_limit_watts={"n1": 700.0, "n2": 700.0},
        profiles=dict(profiles),
        parts={name: Part(profiles_read_at if name == "profiles" else now) for name in PARTS},
        prometheus_up=True,
    )
    fresh, missing = snapshot.fresh_parts(now, STALENESS.readings, STALENESS.inventory)
    return View(facility or make_facility(), snapshot, now, fresh, missing, {}, {})


# --- ranking -------------------------------------------------------------------------------


def test_profiles_rank_by_fresh_tokens_per_joule_and_list_the_rest_unranked():
    view = make_view(
        {
            (MODEL, "h100-tp4"): H100,
            (MODEL, "b200-tp2"): B200,
            # Better than both, but last read 300 s ago: its replicas stopped counting tokens.
            (MODEL, "h100-tp2"): ProfileFigures(5.0, 100.0, 20.0, 1, NOW - 300),
            ("other-model", "tp1"): ProfileFigures(9.0, 1.0, 1.0, 1, NOW),
        }
    )
    ranked = standings(view, MODEL)
    body = answer(view, MODEL, ranked)

    assert [(s["profile"], s["rank"], s["status"]) for s in body["profiles"]] == [
        ("b200-tp2", 1, "measured"),
        ("h100-tp4", 2, "measured"),
        ("h100-tp2", None, "stale"),
        ("h100-tp8", None, "unmeasured"),  # declared for the model, never measured
    ]
    assert body["best"] == "b200-tp2"
    b200, h100, stale, declared = body["profiles"]
    assert (b200["tokens_per_joule"], b200["tokens_per_second"], b200["watts"]) == (
        3.667,
        7078.6,
        1930.1,
    )
    # Per replica: the sums over 2 units halved.
    assert (h100["tokens_per_second"], h100["watts"], h100["replicas"]) == (5858.5, 2490.5, 2)
    assert b200["age_seconds"] == 0 and stale["age_seconds"] == 300
    assert stale["tokens_per_joule"] == 5.0 and declared["tokens_per_joule"] is None
    assert (declared["declared"], declared["gpus"], b200["declared"], b200["gpus"]) == (
        True,
        8,
        False,
        2,
    )
    assert body["summary"] == (
        f"{MODEL}: best b200-tp2, 3.67 tokens/J (next h100-tp4, 2.35); "
        "2 not ranked (no fresh measurement)"
    )


def test_a_stale_profiles_part_ranks_nothing():
    view = make_view({(MODEL, "b200-tp2"): B200}, now=NOW + 200)
    body = answer(view, MODEL, standings(view, MODEL))
    assert body["best"] is None
    assert [s["status"] for s in body["profiles"]] == ["stale", "unmeasured"]
    assert body["profiles"][0]["age_seconds"] == 200
    assert len(body["missing"]) == 1 and "older than its 120s limit" in body["missing"][0]


def test_an_unknown_model_has_no_standings():
    assert standings(make_view({(MODEL, "b200-tp2"): B200}), "no-such-model") == []


# --- placement with alternatives -------------------------------------------------------------


def request(profile: str = "h100-tp4", gpus: int = 4, **body: Any) -> PlacementRequest:
    return PlacementRequest.model_validate(
        {
            "replica": {"model": MODEL, "profile": profile, "gpus": gpus},
            "candidates": ["n1", "n2"],
            **body,
        }
    )


BOTH = {(MODEL, "h100-tp4"): H100, (MODEL, "b200-tp2"): B200}


def test_the_better_measured_profile_is_chosen_and_judged_with_its_own_estimate():
    decision, replica, choice = profile_choice.choose(
        make_view(BOTH), request(profiles=[{"profile": "b200-tp2"}])
    )
    assert replica.profile == "b200-tp2" and replica.gpus == 2  # from the facility file
    # 2 GPUs × 700 W + 400 W × 2/8 = 1500 W, not the 4-GPU 3000 W.
    assert {verdict.estimate.watts for verdict in decision.verdicts} == {1500.0}
    assert choice["chosen"] == "b200-tp2" and choice["default"] == "h100-tp4"
    assert choice["reason"] == (
        "b200-tp2 chosen over h100-tp4 (the replica's own): 3.67 vs 2.35 tokens/J, "
        "both freshly measured"
    )
    assert choice["considered"] == [
        {
            "profile": "h100-tp4",
            "gpus": 4,
            "status": "measured",
            "tokens_per_joule": 2.352,
            "age_seconds": 0.0,
            "allowed_nodes": 2,
        },
        {
            "profile": "b200-tp2",
            "gpus": 2,
            "status": "measured",
            "tokens_per_joule": 3.667,
            "age_seconds": 0.0,
            "allowed_nodes": 2,
        },
    ]


def test_a_better_profile_that_no_node_allows_leaves_the_default():
    # 9 500 W does not fit under rack r1's 10 000 × 0.9 = 9 000 W; the default's 3 000 W does.
    _, replica, choice = profile_choice.choose(
        make_view(BOTH),
        request(profiles=[{"profile": "b200-tp2", "power_watts": 9_500}]),
    )
    assert replica.profile == "h100-tp4"
    assert choice["chosen"] == "h100-tp4"
    assert choice["reason"] == (
        "kept h100-tp4 (2.35 tokens/J): b200-tp2 (3.67) measure better but no candidate node "
        "allows them"
    )
    assert [c["allowed_nodes"] for c in choice["considered"]] == [2, 0]


@pytest.mark.parametrize(
    ("figures", "reason"),
    [
        (
            {(MODEL, "b200-tp2"): B200},
            "kept h100-tp4, the replica's own profile: it has no fresh measurement "
            "(unmeasured), so no alternative is compared with it",
        ),
        (
            {
                (MODEL, "h100-tp4"): H100,
                (MODEL, "b200-tp2"): ProfileFigures(3.667, None, None, None, NOW - 300),
            },
            "kept h100-tp4 (2.35 tokens/J): no alternative with a fresh measurement does "
            "better; not compared, no fresh measurement: b200-tp2",
        ),
    ],
    ids=["default unmeasured", "alternative stale"],
)
def test_without_fresh_figures_for_both_the_default_stays(
    figures: dict[tuple[str, str], ProfileFigures], reason: str
):
    _, replica, choice = profile_choice.choose(
        make_view(figures), request(profiles=[{"profile": "b200-tp2"}])
    )
    assert replica.profile == "h100-tp4" and replica.gpus == 4
    assert choice["chosen"] == "h100-tp4" and choice["reason"] == reason


def test_observe_mode_answers_the_default_and_says_what_enforce_would_choose():
    view = make_view(BOTH, facility=make_facility("observe"))
    decision, replica, choice = profile_choice.choose(
        view, request(profiles=[{"profile": "b200-tp2"}])
    )
    assert replica.profile == "h100-tp4" and decision.order == ["n1", "n2"]
    assert (choice["chosen"], choice["would_choose"]) == ("h100-tp4", "b200-tp2")
    assert choice["reason"].startswith("observe mode, the replica's own profile is answered; ")


@pytest.mark.parametrize(
    ("offered", "problem"),
    [
        ([{"profile": "unlisted"}], "profiles.0.gpus: required: profile 'unlisted' is not in"),
        (
            [{"profile": "b200-tp2"}, {"profile": "h100-tp4", "gpus": 8}],
            "profiles.1.gpus: 8 GPUs, but the replica's own profile 'h100-tp4' has 4",
        ),
    ],
)
def test_an_offer_that_cannot_be_judged_names_its_field(offered: list[Any], problem: str):
    with pytest.raises(profile_choice.BadOption, match=problem):
        profile_choice.choose(make_view(BOTH), request(profiles=offered))


# --- through the API -------------------------------------------------------------------------


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Decider]:
    readings = Readings(
        membership={"n1": ["rack/r1"], "n2": ["rack/r1"]},
        gpus={"n1": 8, "n2": 8},
        limits={"n1": 700.0, "n2": 700.0},
        profiles={
            (MODEL, "h100-tp4"): {
                "tokens_per_joule": 2.352,
                "tokens_per_second": 5858.5,
                "watts": 2490.5,
                "units": 1,
            },
            (MODEL, "b200-tp2"): {"tokens_per_joule": 3.667},
        },
    )
    fake = FakePrometheus(readings)
    decider = Decider(
        tmp_path / "decider", fake.url, make_facility().model_dump(exclude_defaults=True)
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        yield decider
    finally:
        decider.close()
        fake.close()


def test_the_api_ranks_a_models_profiles_and_places_with_alternatives(running: Decider):
    response = running.get(f"/v1/profiles/{MODEL}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert [(p["profile"], p["rank"]) for p in body["profiles"]] == [
        ("b200-tp2", 1),
        ("h100-tp4", 2),
        ("h100-tp8", None),
    ]
    assert body["profiles"][1]["tokens_per_second"] == 5858.5
    assert body["profiles"][0]["tokens_per_second"] is None  # not in Prometheus: not invented

    unknown = running.get("/v1/profiles/no-such-model")
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == (
        "no profile of model 'no-such-model' is measured or declared in the facility file "
        f"(models known: {MODEL})"
    )

    placed = running.post(
        "/v1/placements",
        {
            "replica": {"model": MODEL, "profile": "h100-tp4", "gpus": 4},
            "candidates": ["n1", "n2"],
            "profiles": [{"profile": "b200-tp2"}],
        },
    )
    assert placed.status_code == 200, placed.text
    assert placed.json()["profile_choice"]["chosen"] == "b200-tp2"
    assert {node["estimate_watts"] for node in placed.json()["nodes"]} == {1500.0}
    plain = running.place({"model": MODEL, "profile": "h100-tp4", "gpus": 4}, ["n1"])
    assert "profile_choice" not in plain  # no alternatives offered: the answer as before

    for offered, problem in [
        ([{"profile": "unlisted"}], "profiles.0.gpus: required"),
        ([{"profile": "b200-tp2"}, {"profile": "b200-tp2"}], "offered more than once"),
    ]:
        bad = running.post(
            "/v1/placements",
            {
                "replica": {"model": MODEL, "profile": "h100-tp4", "gpus": 4},
                "candidates": ["n1"],
                "profiles": offered,
            },
        )
        assert bad.status_code == 422 and problem in bad.json()["detail"], bad.text


def test_the_cli_shows_the_ranking(running: Decider, capsys: pytest.CaptureFixture[str]):
    from llmgw_facility.cli import main

    assert main(["profiles", MODEL, "--decider", running.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{MODEL}: best b200-tp2, 3.67 tokens/J")
    assert lines[1].split() == [
        "RANK", "PROFILE", "STATUS", "TOKENS/J", "TOKENS/S", "WATTS", "REPLICAS", "AGE", "S"
    ]  # fmt: skip
    assert lines[2].split()[:4] == ["1", "b200-tp2", "measured", "3.667"]
    assert lines[3].split()[:7] == ["2", "h100-tp4", "measured", "2.352", "5858.5", "2490.5", "1"]
    assert lines[4].split() == ["-", "h100-tp8", "unmeasured", "-", "-", "-", "-", "-"]
    assert main(["profiles", "no-such-model", "--decider", running.url]) == 1
    assert "no profile of model 'no-such-model'" in capsys.readouterr().err


# --- the choice as a property ----------------------------------------------------------------

FIGURE = st.one_of(
    st.none(),  # never measured
    st.tuples(st.floats(0.1, 10), st.sampled_from([NOW, NOW - 300])),  # fresh or stale
)


@given(
    default=st.tuples(FIGURE, st.integers(1_000, 12_000)),
    alternatives=st.lists(st.tuples(FIGURE, st.integers(1_000, 12_000)), max_size=5),
)
def test_the_choice_is_the_best_placeable_profile_measured_better_than_the_default(
    default: tuple[tuple[float, float] | None, int],
    alternatives: list[tuple[tuple[float, float] | None, int]],
):
    # Rack r1 takes up to 10 000 × 0.9 = 9 000 W: a profile drawing more is allowed nowhere.
    names = ["own", *(f"alt{index}" for index in range(len(alternatives)))]
    offers = [default, *alternatives]
    figures = {
        (MODEL, name): ProfileFigures(figure[0], None, None, None, figure[1])
        for name, (figure, _) in zip(names, offers, strict=True)
        if figure is not None
    }
    body = {
        "replica": {"model": MODEL, "profile": "own", "gpus": 1, "power_watts": default[1]},
        "candidates": ["n1", "n2"],
        "profiles": [
            {"profile": name, "gpus": 1, "power_watts": watts}
            for name, (_, watts) in zip(names[1:], alternatives, strict=True)
        ],
    }
    _, replica, choice = profile_choice.choose(
        make_view(figures), PlacementRequest.model_validate(body)
    )

    def fresh(index: int) -> float | None:
        figure = offers[index][0]
        return figure[0] if figure is not None and figure[1] == NOW else None

    def placeable(index: int) -> bool:
        return offers[index][1] <= 9_000

    chosen = names.index(choice["chosen"])
    assert replica.profile == choice["chosen"]
    own = fresh(0)
    better = [i for i in range(1, len(offers)) if own is not None and (fresh(i) or 0) > own]
    placeable_better = [i for i in better if placeable(i)]
    if not placeable_better:
        assert chosen == 0  # nothing measured better and placeable: the default stays
    else:
        assert chosen in placeable_better
        assert fresh(chosen) == max(fresh(i) or 0 for i in placeable_better)
