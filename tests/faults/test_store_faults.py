"""The decider's database on a bad day (issue 16 items 5, 12, 13), as a real `llmgw-decider`
process over real HTTP (tests/decider_harness.py):

- deleted (`rm decider.db*`) or replaced under a running decider: every later write is a 503
  naming the file, /readyz is not ready and says why, `llmgw_decider_database_ok` is 0, and
  nothing is acknowledged that the next start does not read;
- damaged before a start (a zeroed page, bad JSON in a row, a domain `rack/`, a hold on
  `nokind`, a missing column): exit 2 with `FILE: reason`, never a traceback;
- SIGTERM: a clean shutdown, exit 0, the database closed (its WAL checkpointed away).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from decider.facility import DomainRef
from decider.store import Hold, Reservation, Store
from tests.decider_harness import (
    REPO,
    Decider,
    FakePrometheus,
    Readings,
    decider_yaml,
    metric_value,
    poll,
    running,
    serving,
)
from tests.promstack import free_port

NODES = ["n1", "n2"]
FACILITY: dict[str, Any] = {"mode": "enforce", "domains": {"rack/r1": {"cap_watts": 20000}}}
REPLICA = {"model": "llama", "profile": "tp1", "gpus": 1, "power_watts": 900}
START_TIMEOUT_S = 30


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with serving(
        Readings(
            membership={node: ["rack/r1"] for node in NODES},
            inventory=["rack/r1"],
            measured={"rack/r1": 0},
            conditions={"rack/r1": "ok"},
            gpus=dict.fromkeys(NODES, 8),
            limits=dict.fromkeys(NODES, 700.0),
        )
    ) as server:
        yield server


@pytest.fixture
def decider(tmp_path: Path, fake: FakePrometheus) -> Iterator[Decider]:
    with running(tmp_path / "decider", fake.url, FACILITY) as started:
        yield started


def database_files(decider: Decider) -> list[Path]:
    return sorted(decider.directory.glob("decider.db*"))


def every_write(decider: Decider) -> dict[str, Any]:
    """One of each mutating call, and a retry of the reservation made before; their
    responses by name."""
    return {
        "reserve": decider.reserve("after", "n2", REPLICA),
        "retry": decider.reserve("before", "n1", REPLICA),  # acknowledged again: refused too
        "confirm": decider.post("/v1/reservations/before/confirm"),
        "hold": decider.post("/v1/domains/rack/r1/hold", {"reason": "maintenance"}),
        "delete": decider.delete("/v1/reservations/before"),
    }


def assert_refused_naming_the_file(decider: Decider, why: str) -> None:
    database = decider.directory / "decider.db"
    for call, response in every_write(decider).items():
        assert response.status_code == 503, (call, response.status_code, response.text)
        assert f"{database}: " in response.json()["detail"], (call, response.text)
        assert why in response.json()["detail"], (call, response.text)
    ready = decider.get("/readyz")
    assert ready.status_code == 503, ready.text
    assert ready.json()["ready"] is False
    assert ready.json()["database"].startswith(f"{database}: ")
    assert why in ready.json()["database"]
    assert metric_value(decider.metrics(), "llmgw_decider_database_ok") == 0
    assert f"the database cannot be written: {database}: " in decider.log()


def test_a_database_deleted_under_a_running_decider_takes_no_more_writes(decider):
    assert decider.reserve("before", "n1", REPLICA).status_code == 201
    assert metric_value(decider.metrics(), "llmgw_decider_database_ok") == 1
    assert decider.get("/readyz").json()["database"] == "ok"
    files = database_files(decider)
    assert [path.name for path in files] == ["decider.db", "decider.db-wal"]
    for path in files:  # rm decider.db*
        path.unlink()

    assert_refused_naming_the_file(decider, "was deleted while the decider ran")
    # Reads go on from memory: a placement is still answered.
    assert decider.place(REPLICA, ["n1", "n2"])["order"] == ["n1", "n2"]

    # Nothing refused above is on the file the next start reads, nor in memory.
    assert decider.stop() == 0
    decider.start(wait_ready=True)
    assert decider.get("/v1/reservations").json()["reservations"] == []
    assert decider.domain("rack/r1")["held"] is None
    # A new database at the path: writes are taken again.
    assert decider.reserve("after", "n2", REPLICA).status_code == 201
    assert decider.get("/readyz").json()["database"] == "ok"


def test_the_runbooks_rescue_brings_back_everything_acknowledged(decider):
    """docs/runbooks.md, LlmgwDeciderDatabaseLost: copy the open files from /proc, stop the
    decider, move the copies into place, start it."""
    for index in range(5):
        assert decider.reserve(f"r{index}", "n1", REPLICA).status_code == 201
    assert decider.post("/v1/reservations/r1/confirm").status_code == 200
    assert decider.post("/v1/domains/rack/r1/hold", {"reason": "maintenance"}).ok
    for path in database_files(decider):
        path.unlink()
    assert decider.delete("/v1/reservations/r2").status_code == 503
    assert decider.process is not None
    descriptors = Path(f"/proc/{decider.process.pid}/fd")
    database = decider.directory / "decider.db"
    open_files = {os.readlink(fd): fd for fd in descriptors.iterdir()}
    rescued = decider.directory / "rescued.db"
    for name, copy in (("decider.db", rescued), ("decider.db-wal", Path(f"{rescued}-wal"))):
        shutil.copyfile(open_files[f"{database.with_name(name)} (deleted)"], copy)
    assert decider.stop() == 0
    rescued.rename(database)
    Path(f"{rescued}-wal").rename(f"{database}-wal")
    decider.start(wait_ready=True)
    listed = decider.get("/v1/reservations").json()["reservations"]
    assert [(r["id"], r["confirmed"]) for r in listed] == [
        ("r0", False),
        ("r1", True),
        ("r2", False),  # its release was refused, not done
        ("r3", False),
        ("r4", False),
    ]
    assert decider.domain("rack/r1")["held"]["reason"] == "maintenance"


def test_a_database_replaced_under_a_running_decider_takes_no_more_writes(decider):
    assert decider.reserve("before", "n1", REPLICA).status_code == 201
    database = decider.directory / "decider.db"
    copy = database.with_name("copy.db")
    copy.write_bytes(database.read_bytes())
    copy.replace(database)  # another file (inode) at the path, as a restore from backup does

    assert_refused_naming_the_file(decider, "the database was replaced while the decider ran")


# --- damaged before a start ---------------------------------------------------------------


def write_database(path: Path, reservations: int = 1) -> None:
    """A database as a decider leaves it: reservations on rack/r1, a hold, closed."""
    store = Store(path)
    for index in range(reservations):
        store.add(
            Reservation(
                id=f"res-{index:04d}",
                node="n1",
                replica={**REPLICA, "note": "x" * 200},
                estimate_watts=900.0,
                gpus=1,
                domains=(DomainRef("rack", "r1"),),
                created_at=1.0e9,
                expires_at=None,
                confirmed_at=1.0e9,
            )
        )
    store.hold(Hold(DomainRef("rack", "r1"), "maintenance", 1.0e9))
    store.close()


def zero_a_page(path: Path) -> None:
    with sqlite3.connect(path) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'reservations'"
        ).fetchone()[0]
    db.close()
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(bytes(page_size))


def sql(*statements: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        with db:
            for statement in statements:
                db.execute(statement)
        db.close()

    return damage


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "a zeroed page": (zero_a_page, "the database is damaged"),
    "bad JSON in a row": (
        sql("UPDATE reservations SET replica = '{\"model\": ' WHERE id = 'res-0003'"),
        "reservations row 'res-0003': replica '{\"model\": ' is not JSON",
    ),
    "a domain rack/": (
        sql("UPDATE reservations SET domains = '[\"rack/\"]' WHERE id = 'res-0001'"),
        "reservations row 'res-0001': the name is empty",
    ),
    "a hold on nokind": (
        sql("INSERT INTO holds VALUES ('nokind', 'r', 1.0)"),
        "holds row 'nokind': 'nokind' is not kind/name",
    ),
    "a missing column": (
        sql("ALTER TABLE reservations DROP COLUMN confirmed_at"),
        "cannot read the reservations: no such column: confirmed_at",
    ),
    "text for a number": (
        sql("UPDATE reservations SET estimate_watts = 'lots' WHERE id = 'res-0002'"),
        "reservations row 'res-0002': 'lots' is not a number",
    ),
}


def start_once(directory: Path, database: Path) -> subprocess.CompletedProcess[str]:
    """Run `llmgw-decider` on `database` (nothing listens at its Prometheus); it must exit."""
    (directory / "facility.yaml").write_text(yaml.safe_dump(FACILITY))
    config = decider_yaml(
        f"http://127.0.0.1:{free_port()}", listen=f"127.0.0.1:{free_port()}", token=False
    )
    config["database"] = str(database)
    (directory / "decider.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "decider.main", "--config", str(directory / "decider.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_database_stops_the_start_with_the_file_and_the_reason(tmp_path, damage):
    database = tmp_path / "decider.db"
    write_database(database, reservations=60)  # several pages: a zeroed one is a table's
    do_damage, reason = DAMAGE[damage]
    do_damage(database)
    result = start_once(tmp_path, database)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"llmgw-decider: {database}: " in result.stderr
    assert reason in result.stderr


def test_an_undamaged_database_starts(tmp_path):
    """The damage tests' own control: the same database, undamaged, is read."""
    database = tmp_path / "decider.db"
    write_database(database, reservations=60)
    Store(database).close()  # opens, checks every row, closes


# --- SIGTERM ------------------------------------------------------------------------------


def test_sigterm_is_a_clean_shutdown_with_exit_0(decider):
    assert decider.reserve("before", "n1", REPLICA).status_code == 201
    decider.signal(signal.SIGTERM)
    assert poll(lambda: decider.process is not None and decider.process.poll() is not None, "exit")
    assert decider.stop() == 0, decider.log_tail()
    assert "Traceback" not in decider.log()
    # Closed: the WAL checkpointed into the database and removed, as SQLite does on close.
    assert [path.name for path in database_files(decider)] == ["decider.db"]
