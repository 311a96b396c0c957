"""Overrides (docs/decider.md, "Overrides"; issue 17 part 2): the facility team clears a
domain's condition it knows to be a sensor fault, with a reason and a bounded expiry; the
override is kept across restarts, shown in the answers, and gone by itself at expiry."""

from __future__ import annotations

import sqlite3
from types import MappingProxyType

import pytest

from decider import placement
from decider.config import Staleness
from decider.domains_json import domain_json
from decider.facility import DomainRef, Facility
from decider.models import OverrideRequest, Replica
from decider.snapshot import PARTS, Part, Snapshot
from decider.state import State
from decider.store import Store, StoreError

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
