"""Reservations, holds and overrides in SQLite: what the decider must never lose (DESIGN.md §5).

Every change is committed, with `synchronous=FULL` in WAL mode, before the call returns: a
reservation acknowledged to the scheduler survives a `kill -9` or a power cut the moment
after. One connection, used under the caller's lock (decider.state serialises writers).

Only a write on the files the next start reads is acknowledged: the database and its WAL
are checked to be the files at their paths (device and inode, as opened) before and after
each write, so that a database deleted or replaced under a running decider (`rm
decider.db*`) turns every later write into a StoreError naming the file (`problem()` says
why, for /readyz and /metrics), never a 201 into a deleted file.

At start every row is read and checked, and the whole file with `PRAGMA quick_check`: a
damaged database (a zeroed page, a row that is not this decider's) is a StoreError naming
the file and the row, never a traceback or a row silently dropped.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from decider.facility import DomainRef

SCHEMA_VERSION = 2
#: What each older schema version needs to become this one, in order, each in the transaction
#: that also sets the version (a start that fails half-way leaves the file as it was).
_UPGRADES = {
    # 1 -> 2: the host a reservation brought up (Reservation.host_watts); 0 for those made
    # before, which the upgrade cannot know.
    1: "ALTER TABLE reservations ADD COLUMN host_watts REAL NOT NULL DEFAULT 0",
}

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
    confirmed_at REAL,
    host_watts REAL NOT NULL DEFAULT 0  -- the rest of the node share it brought up
);
CREATE TABLE IF NOT EXISTS holds (
    domain TEXT PRIMARY KEY,        -- kind/name
    reason TEXT NOT NULL,
    held_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS overrides (
    domain TEXT PRIMARY KEY,        -- kind/name: its condition is cleared until expires_at
    reason TEXT NOT NULL,
    by TEXT NOT NULL,               -- who set it, as they gave it ("ops" by default)
    set_at REAL NOT NULL,
    expires_at REAL NOT NULL        -- after set_at, at most OVERRIDE_MAX_SECONDS after it
);
CREATE TABLE IF NOT EXISTS shedding_moves (
    domain TEXT PRIMARY KEY,        -- kind/name: the last move proposed off this domain
    reservation TEXT NOT NULL,
    proposed_at REAL NOT NULL,
    left_at REAL                    -- when the replica was first seen gone; NULL: still there
);
"""


#: The longest an override may last (docs/decider.md, "Overrides"): a week, so that a sensor
#: fault cleared by hand is looked at again, never forgotten for good.
OVERRIDE_MAX_SECONDS = 7 * 24 * 3600.0


class StoreError(Exception):
    """The database cannot be opened, read or written; the message says which file and why."""


#: (st_dev, st_ino) of each file: a file's identity, whatever its path.
Identity = tuple[tuple[int, int], ...]
Row = TypeVar("Row")


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _optional_number(value: Any) -> float | None:
    return None if value is None else _number(value)


def _json(text: Any, column: str, shape: type) -> Any:
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{column} {text!r} is not JSON ({exc})") from exc
    if not isinstance(value, shape):
        raise ValueError(f"{column} {text!r} is not a JSON {shape.__name__}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not text")
    return value


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
    #: The rest of its node's share beyond its own GPUs' share, where its node held no
    #: reservation when it was made: the host it brought up (predicted_peak.host_rest_watts),
    #: which an oversubscribed domain counts with its peak until measured.
    host_watts: float = 0.0

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


@dataclass(frozen=True, slots=True)
class Override:
    """The facility team clears a domain's condition (a sensor they know to be at fault)
    until `expires_at`: placement reads the domain as `ok` meanwhile (decider.placement.view)."""

    domain: DomainRef
    reason: str
    by: str
    set_at: float
    expires_at: float

    def active(self, now: float) -> bool:
        return now < self.expires_at


def _override(row: tuple[Any, ...]) -> Override:
    """An overrides row, checked as this decider writes it (ValueError saying what is not)."""
    set_at, expires_at = _number(row[3]), _number(row[4])
    if not 0 < expires_at - set_at <= OVERRIDE_MAX_SECONDS:
        raise ValueError(
            f"expires_at {expires_at!r} is not after set_at {set_at!r} by at most "
            f"{OVERRIDE_MAX_SECONDS:g}s"
        )
    return Override(
        DomainRef.parse(_text(row[0])), _text(row[1]), _text(row[2]), set_at, expires_at
    )


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        # SQLite names the WAL after the database's real path (symlinks resolved).
        self.wal_path = Path(f"{os.path.realpath(path)}-wal")
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
            if not 0 <= version <= SCHEMA_VERSION:
                raise StoreError(
                    f"{path}: database schema version {version}, this decider knows "
                    f"{SCHEMA_VERSION}: written by a newer decider?"
                )
            self._db.executescript(_SCHEMA)  # a new file's tables, this version's
            self._db.execute("BEGIN IMMEDIATE")
            for step in range(version or SCHEMA_VERSION, SCHEMA_VERSION):
                self._db.execute(_UPGRADES[step])
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute("COMMIT")
            damage = [
                line.strip(" *")
                for (row,) in self._db.execute("PRAGMA quick_check(5)").fetchall()
                for line in str(row).splitlines()
            ]
            if damage != ["ok"]:
                self._db.close()
                raise StoreError(f"{path}: the database is damaged: {'; '.join(damage)}")
            # The files as opened: the WAL exists from the first write (the one above) on. An
            # in-memory database (tests) has no files to lose.
            self._identity: Identity | None = (
                None if str(path) == ":memory:" else self._identities()
            )
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise StoreError(
                    f"{path}: the database is in use by another process (another decider?); "
                    "one decider per database"
                ) from exc
            raise StoreError(f"{path}: cannot open the database: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot open the database: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"{path}: cannot open the database: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    # --- the files' identity ------------------------------------------------------------------

    def _identities(self) -> Identity:
        """The database's and its WAL's (device, inode) at their paths; OSError if either is
        gone."""
        return tuple(
            (status.st_dev, status.st_ino)
            for status in (os.stat(self.path), os.stat(self.wal_path))
        )

    def problem(self) -> str | None:
        """None while the files at the database's paths are the ones this decider writes;
        else why not (deleted, replaced): a write now would be on files no start reads."""
        if self._identity is None:
            return None
        try:
            found = self._identities()
        except FileNotFoundError as exc:
            return (
                f"{exc.filename} was deleted while the decider ran: the decider writes to a "
                "file no start would read, so it writes nothing more (docs/runbooks.md)"
            )
        except OSError as exc:
            return f"cannot check the database's files: {exc}"
        if found != self._identity:
            return (
                "the database was replaced while the decider ran (its file or WAL at the "
                "path is another file): the decider writes nothing more (docs/runbooks.md)"
            )
        return None

    def check_files(self) -> None:
        """StoreError naming the file unless it is the one at its path (see `problem`): for an
        answer that acknowledges a write made before (an idempotent retry) as much as for a
        write."""
        problem = self.problem()
        if problem is not None:
            raise StoreError(f"{self.path}: {problem}")

    @contextmanager
    def _on_the_files(self) -> Iterator[None]:
        """Write only to the files the next start reads, and report a write done while they
        were deleted or replaced as failed (StoreError): never acknowledged."""
        self.check_files()
        yield
        self.check_files()

    def _write(self, sql: str, parameters: tuple[Any, ...]) -> sqlite3.Cursor:
        with self._on_the_files():
            try:
                return self._db.execute(sql, parameters)  # autocommit: durable on return
            except sqlite3.IntegrityError:
                raise
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot write: {exc}") from exc

    # --- reading at start ---------------------------------------------------------------------

    def _rows(self, what: str, sql: str, build: Callable[[tuple[Any, ...]], Row]) -> list[Row]:
        """Every row of a query, each built and checked; StoreError naming the file and the
        row (its first column) on a row this decider did not write or cannot read."""
        try:
            rows = self._db.execute(sql).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(
                f"{self.path}: cannot read the {what}: {exc} (a damaged file, or a table "
                "not of this decider's schema)"
            ) from exc
        built = []
        for row in rows:
            try:
                built.append(build(row))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise StoreError(f"{self.path}: {what} row {row[0]!r}: {exc}") from exc
        return built

    # --- reservations -------------------------------------------------------------------------

    def reservations(self) -> list[Reservation]:
        return self._rows(
            "reservations",
            "SELECT id, node, replica, estimate_watts, gpus, domains, created_at, expires_at, "
            "confirmed_at, host_watts FROM reservations ORDER BY created_at, id",
            _reservation,
        )

    def add(self, reservation: Reservation) -> bool:
        """Store it; False if a reservation with this id exists (nothing written then)."""
        try:
            self._write(
                "INSERT INTO reservations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    reservation.host_watts,
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
        holds = self._rows(
            "holds",
            "SELECT domain, reason, held_at FROM holds",
            lambda row: Hold(DomainRef.parse(_text(row[0])), _text(row[1]), _number(row[2])),
        )
        return {hold.domain: hold for hold in holds}

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

    # --- overrides ----------------------------------------------------------------------------

    def overrides(self) -> dict[DomainRef, Override]:
        """Every override stored, expired ones included (decider.state drops those)."""
        overrides = self._rows(
            "overrides",
            "SELECT domain, reason, by, set_at, expires_at FROM overrides",
            _override,
        )
        return {override.domain: override for override in overrides}

    def override(self, override: Override) -> None:
        """Override the domain's condition (a second override replaces the first)."""
        self._write(
            "INSERT INTO overrides VALUES (?, ?, ?, ?, ?) ON CONFLICT(domain) DO UPDATE SET "
            "reason = excluded.reason, by = excluded.by, set_at = excluded.set_at, "
            "expires_at = excluded.expires_at",
            (
                str(override.domain),
                override.reason,
                override.by,
                override.set_at,
                override.expires_at,
            ),
        )

    def end_overrides(self, domains: list[DomainRef]) -> int:
        """Delete these domains' overrides in one transaction; how many existed."""
        if not domains:
            return 0
        placeholders = ", ".join("?" for _ in domains)
        cursor = self._write(
            f"DELETE FROM overrides WHERE domain IN ({placeholders})",
            tuple(str(domain) for domain in domains),
        )
        return cursor.rowcount

    # --- shedding pacing ----------------------------------------------------------------------

    def proposals(self) -> dict[DomainRef, Proposal]:
        rows = self._rows(
            "shedding moves",
            "SELECT domain, reservation, proposed_at, left_at FROM shedding_moves",
            lambda row: (
                DomainRef.parse(_text(row[0])),
                Proposal(_text(row[1]), _number(row[2]), _optional_number(row[3])),
            ),
        )
        return dict(rows)

    def set_proposals(self, changed: dict[DomainRef, Proposal | None]) -> None:
        """Record (or, for None, forget) each domain's last proposed move, in one transaction."""
        if not changed:
            return
        with self._on_the_files():
            self._set_proposals(changed)

    def _set_proposals(self, changed: dict[DomainRef, Proposal | None]) -> None:
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


def _reservation(row: tuple[Any, ...]) -> Reservation:
    """A reservations row, checked as this decider writes it (ValueError saying what is not)."""
    replica = _json(row[2], "replica", dict)
    domains = _json(row[5], "domains", list)
    gpus = row[4]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ValueError(f"gpus {gpus!r} is not a count")
    return Reservation(
        id=_text(row[0]),
        node=_text(row[1]),
        replica=replica,
        estimate_watts=_number(row[3]),
        gpus=gpus,
        domains=tuple(DomainRef.parse(_text(key)) for key in domains),
        created_at=_number(row[6]),
        expires_at=_optional_number(row[7]),
        confirmed_at=_optional_number(row[8]),
        host_watts=_number(row[9]),
    )
