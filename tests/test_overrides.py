"""Overrides (docs/decider.md, "Overrides"; issue 17 part 2): the facility team clears a
domain's condition it knows to be a sensor fault, with a reason and a bounded expiry; the
override is kept across restarts, shown in the answers, and gone by itself at expiry."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from types import MappingProxyType

import pytest

from decider import placement
from decider.config import Staleness
from decider.domains_json import domain_json
from decider.facility import DomainRef, Facility
from decider.models import OverrideRequest, Replica
from decider.shedding import planner
from decider.snapshot import PARTS, Part, Snapshot
from decider.state import State
from decider.store import Store, StoreError
from llmgw_facility.cli import main
from tests.decider_harness import Decider, FakePrometheus, Readings, poll

REPLICA = Replica(model="m", profile="p", gpus=1, power_watts=10)
ROW = DomainRef("row", "12")
RACK = DomainRef("rack", "r12-07")
T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def make_state(path, clock) -> State:
    state = State(
        Facility.model_validate({"mode": "enforce"}),
        Store(path),
        300,
        Staleness(readings=120, inventory=3600),
        clock=lambda: clock[0],
    )
    state.set_snapshot(
        Snapshot(
            membership=MappingProxyType({"n1": (RACK, ROW)}),
            conditions=MappingProxyType({RACK: "ok", ROW: "hot"}),
            parts={part: Part(clock[0]) for part in PARTS},
            prometheus_up=True,
        )
    )
    return state


def answer(state: State) -> dict:
    return placement.decide(state.view(), REPLICA, ["n1"]).as_json()


def test_an_override_clears_a_hot_row_until_it_expires_and_says_so(tmp_path):
    clock = [T0]
    state = make_state(tmp_path / "decider.db", clock)
    assert answer(state)["nodes"][0]["reasons"] == ["row 12 hot"]

    state.override(ROW, "sensor fault", 100, "ops")
    placed = answer(state)
    assert placed["nodes"][0]["allowed"] and placed["nodes"][0]["reasons"] == []
    assert placed["nodes"][0]["condition"] == "ok"
    note = "row 12 hot, overridden by ops until 22:15 UTC: sensor fault"
    assert note in placed["missing"]
    shown = domain_json(state.view(), ROW)
    assert shown["condition"] == "ok"
    assert shown["override"]["condition"] == "hot" and shown["override"]["text"] == note

    clock[0] += 99
    assert answer(state)["nodes"][0]["allowed"]
    clock[0] += 1  # expired: the View stops reading it at once, before any sweep
    assert answer(state)["nodes"][0]["reasons"] == ["row 12 hot"]
    assert domain_json(state.view(), ROW)["override"] is None
    state.expire()  # the sweep deletes the row
    assert state.store.overrides() == {}


def test_an_override_survives_a_restart_and_ends_early_on_request(tmp_path):
    clock = [T0]
    state = make_state(tmp_path / "decider.db", clock)
    state.override(ROW, "sensor fault", 7200, "alice")
    state.store.close()

    again = make_state(tmp_path / "decider.db", clock)
    assert answer(again)["nodes"][0]["allowed"]
    assert list(again.overrides()) == [ROW]
    assert again.end_override(ROW)
    assert answer(again)["nodes"][0]["reasons"] == ["row 12 hot"]
    assert not again.end_override(ROW)  # none left: nothing to end
    again.store.close()
    assert Store(tmp_path / "decider.db").overrides() == {}


def test_an_override_expired_while_the_decider_was_down_is_not_applied(tmp_path):
    clock = [T0]
    state = make_state(tmp_path / "decider.db", clock)
    state.override(ROW, "sensor fault", 600, "ops")
    state.store.close()
    clock[0] += 601
    again = make_state(tmp_path / "decider.db", clock)
    assert answer(again)["nodes"][0]["reasons"] == ["row 12 hot"]
    again.expire()
    assert again.store.overrides() == {}


def test_an_override_of_a_rack_clears_only_that_rack(tmp_path):
    clock = [T0]
    state = make_state(tmp_path / "decider.db", clock)
    state.override(RACK, "inlet probe reads the exhaust", 3600, "ops")
    # The row is still hot on its own evidence: the rack's override does not clear it.
    assert answer(state)["nodes"][0]["reasons"] == ["row 12 hot"]


@pytest.mark.parametrize("seconds", [0, 59, 7 * 24 * 3600 + 1, float("inf")])
def test_an_override_is_bounded(seconds):
    with pytest.raises(ValueError, match="for_seconds"):
        OverrideRequest(reason="sensor fault", for_seconds=seconds)


def test_a_damaged_override_row_is_refused_at_start_naming_the_row(tmp_path):
    path = tmp_path / "decider.db"
    Store(path).close()
    connection = sqlite3.connect(path)
    connection.execute(
        "INSERT INTO overrides VALUES ('row/12', 'sensor fault', 'ops', ?, ?)",
        (T0, T0 + 30 * 24 * 3600),  # a month: more than any override lasts
    )
    connection.commit()
    connection.close()
    with pytest.raises(StoreError, match=r"overrides row 'row/12': expires_at .* at most"):
        Store(path).overrides()


# --- through the HTTP API and the CLI, with a real decider --------------------------------------

PLACE = {"replica": {"model": "m", "profile": "p", "gpus": 1, "power_watts": 10}}


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus(
        Readings(
            membership={"n1": ["rack/r12-07", "row/12"]},
            inventory=["rack/r12-07", "row/12"],
            conditions={"rack/r12-07": "ok", "row/12": "hot"},
            gpus={"n1": 8},
        )
    )
    yield server
    server.close()


def placed(decider: Decider) -> dict:
    response = decider.post("/v1/placements", {**PLACE, "candidates": ["n1"]})
    assert response.status_code == 200, response.text
    return response.json()


def test_an_override_through_the_cli_is_kept_across_a_restart_and_ended(tmp_path, fake, capsys):
    decider = Decider(tmp_path / "decider", fake.url, {"mode": "enforce"})
    try:
        decider.start()
        poll(lambda: placed(decider)["nodes"][0]["reasons"] == ["row 12 hot"], "row 12 hot")
        token = ["--decider", decider.url, "--token-file", str(decider.directory / "decider.token")]

        # Bounded, and the token is needed.
        with pytest.raises(SystemExit) as exited:
            main(["override", "row/12", "--for", "8d", "--reason", "x", *token])
        assert exited.value.code == 2
        assert "'8d': an override lasts 1m to 7d" in capsys.readouterr().err
        assert decider.post("/v1/domains/row/12/override", {"reason": "x", "for_seconds": 600},
                            token=None).status_code == 401  # fmt: skip
        too_long = decider.post("/v1/domains/row/12/override", {"reason": "x", "for_seconds": 1e7})
        assert too_long.status_code == 422 and "for_seconds" in too_long.text
        capsys.readouterr()

        assert main(["override", "row/12", "--for", "2h", "--reason", "sensor fault", *token]) == 0
        out = capsys.readouterr().out
        assert out.startswith("overrode row/12: row 12 hot, overridden by ops until "), out
        answer = placed(decider)
        assert answer["nodes"][0]["allowed"] and answer["nodes"][0]["reasons"] == []
        [note] = [line for line in answer["missing"] if "overridden" in line]
        assert note.endswith(": sensor fault") and note.startswith("row 12 hot, overridden by ops")
        row = decider.get("/v1/domains/row/12").json()
        assert row["condition"] == "ok" and row["override"]["condition"] == "hot"
        page = decider.get("/").text
        assert f'<span class="overridden">OVERRIDDEN</span> {note}' in page
        main(["facility", "--decider", decider.url])
        assert f"row/12: {note}" in capsys.readouterr().out.splitlines()
        metrics = decider.get("/metrics").text
        assert 'llmgw_domain_condition_overridden{domain="12",kind="row"} 1.0' in metrics

        decider.stop()  # kept across a restart
        decider.start()
        poll(lambda: decider.get("/v1/domains/row/12").json().get("override"), "the override again")
        assert placed(decider)["nodes"][0]["allowed"]

        token[1] = decider.url  # a new port at each start
        assert main(["override", "row/12", "--end", *token]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"ended the override of row/12 ({note})",
            "its condition is now the rules' own: hot",
        ]
        assert placed(decider)["nodes"][0]["reasons"] == ["row 12 hot"]
        assert main(["override", "row/12", "--end", *token]) == 0
        assert capsys.readouterr().out == "row/12 has no override; nothing to end\n"
        response = decider.delete("/v1/domains/row/12/override")  # DELETE ends it as well
        assert response.status_code == 200 and response.json()["override"] is None
    finally:
        decider.close()


def test_the_shedding_plan_leaves_an_overridden_domain_alone(tmp_path):
    clock = [T0]
    state = State(
        Facility.model_validate({"mode": "enforce", "shedding": {"enabled": True}}),
        Store(tmp_path / "decider.db"),
        300,
        Staleness(readings=120, inventory=3600),
        clock=lambda: clock[0],
    )
    state.set_snapshot(
        Snapshot(
            membership=MappingProxyType({"n1": (RACK, ROW)}),
            conditions=MappingProxyType({RACK: "ok", ROW: "hot"}),
            hot_seconds=MappingProxyType({ROW: 3600.0}),
            parts={part: Part(clock[0]) for part in PARTS},
            prometheus_up=True,
        )
    )
    assert [entry["domain"] for entry in planner.plan(state.view(), T0, {}).entries] == ["row/12"]
    state.override(ROW, "sensor fault", 600, "ops")
    assert planner.plan(state.view(), T0, {}).entries == []
