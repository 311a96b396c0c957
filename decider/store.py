"""Reservations and holds in SQLite: what the decider must never lose (DESIGN.md §5).

Every change is committed, with `synchronous=FULL` in WAL mode, before the call returns: a
reservation acknowledged to the scheduler survives a `kill -9` or a power cut the moment
after. One connection, used under the caller's lock (decider.state serialises writers).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from decider.facility import DomainRef

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reservations (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    replica TEXT NOT NULL,          -- the request's replica, JSON
    estimate_watts REAL NOT NULL,
    gpus INTEGER NOT NULL,
    domains TEXT NOT NULL,          -- the node's domains when reserved, JSON ["rack/r1", ...]
    created_at REAL NOT NULL,
    expires_at REAL,                -- NULL once confirmed
    confirmed_at REAL
);
CREATE TABLE IF NOT EXISTS holds (
    domain TEXT PRIMARY KEY,        -- kind/name
    reason TEXT NOT NULL,
    held_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS shedding_moves (
    domain TEXT PRIMARY KEY,        -- kind/name: the last move proposed off this domain
    reservation TEXT NOT NULL,
    proposed_at REAL NOT NULL,
    left_at REAL                    -- when the replica was first seen gone; NULL: still there
);
"""


class StoreError(Exception):
    """The database cannot be opened or written; the message says which file and why."""


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    node: str
    replica: dict[str, Any]
    estimate_watts: float
    gpus: int
    domains: tuple[DomainRef, ...]
    created_at: float
    expires_at: float | None
    confirmed_at: float | None = None

    @property
    def model(self) -> str:
        return str(self.replica.get("model", ""))

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["domains"] = [str(ref) for ref in self.domains]
        data["confirmed"] = self.confirmed_at is not None
        return data


@dataclass(frozen=True, slots=True)
class Proposal:
    """The last move a shedding plan proposed off a domain (decider.shedding's pacing)."""

    reservation: str
    proposed_at: float
    left_at: float | None = None  # when the replica was first seen gone from the domain


@dataclass(frozen=True, slots=True)
class Hold:
    domain: DomainRef
    reason: str
    held_at: float


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # check_same_thread=False: writers are serialised by decider.state's lock.
            self._db = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=2.0
            )
            # One decider per database: two would each trust their own copy in memory. The
            # exclusive lock, taken by the first write below, keeps a second one out.
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise StoreError(
                    f"{path}: database schema version {version}, this decider knows "
                    f"{SCHEMA_VERSION}: written by a newer decider?"
                )
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise StoreError(
                    f"{path}: the database is in use by another process (another decider?); "
                    "one decider per database"
                ) from exc
            raise StoreError(f"{path}: cannot open the database: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the database: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def _write(self, sql: str, parameters: tuple[Any, ...]) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, parameters)  # autocommit: durable on return
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot write: {exc}") from exc

    # --- reservations -------------------------------------------------------------------------

    def reservations(self) -> list[Reservation]:
        rows = self._db.execute(
            "SELECT id, node, replica, estimate_watts, gpus, domains, created_at, expires_at, "
            "confirmed_at FROM reservations ORDER BY created_at, id"
        ).fetchall()
        return [
            Reservation(
                id=row[0],
                node=row[1],
                replica=json.loads(row[2]),
                estimate_watts=row[3],
                gpus=row[4],
                domains=tuple(DomainRef.parse(key) for key in json.loads(row[5])),
                created_at=row[6],
                expires_at=row[7],
                confirmed_at=row[8],
            )
            for row in rows
        ]

    def add(self, reservation: Reservation) -> bool:
        """Store it; False if a reservation with this id exists (nothing written then)."""
        try:
            self._write(
                "INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    reservation.id,
                    reservation.node,
                    json.dumps(reservation.replica, sort_keys=True),
                    reservation.estimate_watts,
                    reservation.gpus,
                    json.dumps([str(ref) for ref in reservation.domains]),
                    reservation.created_at,
                    reservation.expires_at,
                    reservation.confirmed_at,
                ),
            )
        except sqlite3.IntegrityError:
            return False
        return True

    def confirm(self, reservation_id: str, at: float) -> bool:
        """Confirmed reservations no longer expire; False if there is no such reservation."""
        cursor = self._write(
            "UPDATE reservations SET expires_at = NULL, confirmed_at = COALESCE(confirmed_at, ?) "
            "WHERE id = ?",
            (at, reservation_id),
        )
        return cursor.rowcount == 1

    def delete(self, reservation_ids: list[str]) -> int:
        """Delete these reservations in one transaction; how many existed."""
        if not reservation_ids:
            return 0
        placeholders = ", ".join("?" for _ in reservation_ids)
        cursor = self._write(
            f"DELETE FROM reservations WHERE id IN ({placeholders})", tuple(reservation_ids)
        )
        return cursor.rowcount

    # --- holds --------------------------------------------------------------------------------

    def holds(self) -> dict[DomainRef, Hold]:
        rows = self._db.execute("SELECT domain, reason, held_at FROM holds").fetchall()
        holds = {}
        for key, reason, held_at in rows:
            ref = DomainRef.parse(key)
            holds[ref] = Hold(ref, reason, held_at)
        return holds

    def hold(self, hold: Hold) -> None:
        """Hold the domain (a second hold replaces the reason and time)."""
        self._write(
            "INSERT INTO holds VALUES (?, ?, ?) ON CONFLICT(domain) DO UPDATE SET "
            "reason = excluded.reason, held_at = excluded.held_at",
            (str(hold.domain), hold.reason, hold.held_at),
        )

    def release(self, domain: DomainRef) -> bool:
        """Release the hold; False if the domain was not held."""
        return self._write("DELETE FROM holds WHERE domain = ?", (str(domain),)).rowcount == 1

    # --- shedding pacing ----------------------------------------------------------------------

    def proposals(self) -> dict[DomainRef, Proposal]:
        rows = self._db.execute(
            "SELECT domain, reservation, proposed_at, left_at FROM shedding_moves"
        ).fetchall()
        return {DomainRef.parse(key): Proposal(*row) for key, *row in rows}

    def set_proposals(self, changed: dict[DomainRef, Proposal | None]) -> None:
        """Record (or, for None, forget) each domain's last proposed move, in one transaction."""
        if not changed:
            return
        try:
            self._db.execute("BEGIN")
            for domain, proposal in changed.items():
                if proposal is None:
                    self._db.execute("DELETE FROM shedding_moves WHERE domain = ?", (str(domain),))
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO shedding_moves VALUES (?, ?, ?, ?)",
                        (str(domain), proposal.reservation, proposal.proposed_at, proposal.left_at),
                    )
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise StoreError(f"{self.path}: cannot write: {exc}") from exc
