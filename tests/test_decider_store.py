"""decider.store on its own: one decider per database, and what a reopen finds."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from decider.facility import DomainRef
from decider.store import SCHEMA_VERSION, Hold, Reservation, Store, StoreError


def reservation(reservation_id: str = "r-1") -> Reservation:
    return Reservation(
        id=reservation_id,
        node="n1",
        replica={"model": "m", "profile": "p", "gpus": 4},
        estimate_watts=2975.0,
        gpus=4,
        domains=(DomainRef("rack", "r1"), DomainRef("pdu", "p1-a")),
        created_at=100.0,
        expires_at=400.0,
    )


def test_a_second_store_on_the_same_database_is_refused_with_the_reason(tmp_path):
    first = Store(tmp_path / "decider.db")
    with pytest.raises(StoreError, match="in use by another process"):
        Store(tmp_path / "decider.db")
    first.close()
    Store(tmp_path / "decider.db").close()  # free again once the first is gone


def test_what_was_written_is_there_after_a_reopen(tmp_path):
    store = Store(tmp_path / "decider.db")
    assert store.add(reservation())
    assert not store.add(reservation()), "a second insert of one id must be refused"
    assert store.confirm("r-1", 150.0)
    store.hold(Hold(DomainRef("rack", "r1"), "CRAC-3 maintenance", 160.0))
    store.close()

    again = Store(tmp_path / "decider.db")
    (found,) = again.reservations()
    assert (found.id, found.expires_at, found.confirmed_at) == ("r-1", None, 150.0)
    assert found.domains == (DomainRef("rack", "r1"), DomainRef("pdu", "p1-a"))
    assert again.holds()[DomainRef("rack", "r1")].reason == "CRAC-3 maintenance"
    assert again.delete(["r-1", "unknown"]) == 1
    assert again.release(DomainRef("rack", "r1"))
    assert not again.release(DomainRef("rack", "r1"))
    again.close()


def test_a_database_of_schema_1_is_upgraded_and_keeps_its_reservations(tmp_path):
    """Schema 1 had no host_watts: its reservations read 0 (unknown), new ones keep theirs."""
    path = tmp_path / "decider.db"
    connection = sqlite3.connect(path)
    connection.executescript(
        """
        CREATE TABLE reservations (id TEXT PRIMARY KEY, node TEXT NOT NULL,
            replica TEXT NOT NULL, estimate_watts REAL NOT NULL, gpus INTEGER NOT NULL,
            domains TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL,
            confirmed_at REAL);
        INSERT INTO reservations VALUES ('old', 'n1', '{"gpus": 4}', 2975.0, 4,
            '["rack/r1"]', 50.0, NULL, 150.0);
        PRAGMA user_version=1;
        """
    )
    connection.close()
    store = Store(path)
    (old,) = store.reservations()
    assert (old.id, old.confirmed_at, old.host_watts) == ("old", 150.0, 0.0)
    assert store.add(replace(reservation("new"), host_watts=1_225.0))
    store.close()
    again = Store(path)
    assert [(r.id, r.host_watts) for r in again.reservations()] == [
        ("old", 0.0),
        ("new", 1_225.0),
    ]
    again.close()
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    connection.close()


def test_a_database_from_a_newer_decider_is_refused(tmp_path):
    path = tmp_path / "decider.db"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA user_version=99")
    connection.close()
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path)


def test_a_database_that_is_not_one_is_refused(tmp_path):
    path = tmp_path / "decider.db"
    path.write_bytes(b"this is not an SQLite database" * 100)
    with pytest.raises(StoreError, match="cannot open the database"):
        Store(path)
