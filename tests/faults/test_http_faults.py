"""The decider's HTTP edge under bodies, names and headers built to hurt (issue 16, items 7,
10, 11 and 13): a real `llmgw-decider` on 127.0.0.1 (tests/decider_harness.py), spoken to
through `requests` and, where a client would refuse to send what is tried, a raw socket.

- The token is checked before the body is read; a body past its limit gets 413 before it
  is read whole (a declared Content-Length at once, a chunked one at the limit).
- Ids, names and reasons keep to one set of characters and lengths (decider/names.py): 422
  naming the field; a facility file naming a domain `rack/..` is refused at start.
- Strict types: a string, a boolean or a float is not an integer.
- Candidates the site does not know are answered, never cached: the process does not grow
  with the names callers make up.
- A 1 MB request header gets 431, not a reset connection.
- Every answer of every route parses as strict JSON (no NaN, no Infinity).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from decider.api.body_limit import MAX_BODY_BYTES, MAX_PLACEMENT_BODY_BYTES
from tests.decider_harness import TOKEN, Decider, Readings, running, serving

NODES = {f"n{index}": ["rack/r1", "pdu/r1-a", "row/1"] for index in range(4)}
FACILITY: dict[str, Any] = {
    "domains": {"rack/r1": {"cap_watts": 20000}, "pdu/r1-a": {"cap_watts": 15000}},
    "profiles": {"p4": {"gpus": 4}},
    "mode": "enforce",
}
REPLICA = {"model": "llama", "profile": "p4", "gpus": 1, "power_watts": 500}
#: How long an answer that must come before the body is read may take on a busy machine.
ANSWER_S = 10.0


def readings() -> Readings:
    return Readings(
        membership={node: list(domains) for node, domains in NODES.items()},
        inventory=["rack/r1", "row/1"],
        measured={"rack/r1": 3000, "pdu/r1-a": 1000},
        conditions={"rack/r1": "ok", "pdu/r1-a": "ok", "row/1": "ok"},
        gpus=dict.fromkeys(NODES, 8),
        limits=dict.fromkeys(NODES, 700.0),
        profiles={("llama", "p4"): {"tokens_per_joule": 2.0, "watts": 2000.0}},
    )


@pytest.fixture(scope="module")
def decider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Decider]:
    with (
        serving(readings()) as fake,
        running(tmp_path_factory.mktemp("edge"), fake.url, FACILITY) as started,
    ):
        yield started


# --- raw HTTP ------------------------------------------------------------------------------


def connect(decider: Decider) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", decider.port), timeout=ANSWER_S)
    connection.settimeout(ANSWER_S)
    return connection


def read_status(connection: socket.socket) -> tuple[int, bytes]:
    """The status of the answer on `connection` and what came with it, read until the end
    of its head (and what of its body came along)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65536)
        if not chunk:
            break
        received += chunk
    assert received.startswith(b"HTTP/1.1 "), received[:200]
    return int(received.split(b" ", 2)[1]), received


def head(path: str, *lines: str) -> bytes:
    return ("\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *lines]) + "\r\n\r\n").encode()


def answered_before(connection: socket.socket, sending: bytes, most: int) -> tuple[int, int]:
    """Send `sending` over and over until the server answers (or `most` bytes were sent):
    the answer's status and how much was sent."""
    connection.setblocking(False)
    sent = 0
    pending = memoryview(sending)  # what is left of the copy being sent: frames stay whole
    deadline = time.monotonic() + ANSWER_S * 3
    while sent < most and time.monotonic() < deadline:
        try:
            if connection.recv(1, socket.MSG_PEEK):
                break
        except BlockingIOError:
            pass
        try:
            wrote = connection.send(pending)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += wrote
        pending = pending[wrote:] or memoryview(sending)
    connection.setblocking(True)
    connection.settimeout(ANSWER_S)
    status, _ = read_status(connection)
    return status, sent


# --- bodies before the token, and their size -----------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/reservations", "/v1/domains/rack/r1/hold", "/v1/reservations/x/confirm"]
)
def test_a_body_without_the_token_is_refused_before_it_is_read(decider, path):
    """A body of the largest size allowed announced, a few bytes of it sent: the 401 comes
    without the rest (before: the decider waited for the whole body, to parse it)."""
    with connect(decider) as connection:
        connection.sendall(
            head(path, "Content-Type: application/json", f"Content-Length: {MAX_BODY_BYTES}")
        )
        connection.sendall(b'{"id": ')
        status, received = read_status(connection)
    assert status == 401, received[:300]
    assert b"www-authenticate: bearer" in received.lower()


def test_a_huge_body_without_the_token_is_refused_unread(decider):
    """100 MB announced, without the token: refused at once, unread (413: its size is
    judged before anything else)."""
    with connect(decider) as connection:
        connection.sendall(
            head(
                "/v1/reservations",
                "Content-Type: application/json",
                f"Content-Length: {100 * 2**20}",
            )
        )
        connection.sendall(b"[" + b"1," * 32768)
        status, received = read_status(connection)
    assert status == 413, received[:300]


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/placements", MAX_PLACEMENT_BODY_BYTES), ("/v1/reservations", MAX_BODY_BYTES)],
)
def test_a_declared_body_past_the_limit_gets_413_unread(decider, path, limit):
    with connect(decider) as connection:
        connection.sendall(
            head(
                path,
                "Content-Type: application/json",
                f"Authorization: Bearer {TOKEN}",
                f"Content-Length: {limit + 1}",
            )
        )
        status, received = read_status(connection)
        while chunk := connection.recv(65536):  # to the end: the server closes after it
            received += chunk
    assert status == 413, received[:300]
    assert str(limit).encode() in received


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/placements", MAX_PLACEMENT_BODY_BYTES), ("/v1/reservations", MAX_BODY_BYTES)],
)
def test_a_chunked_body_is_cut_at_the_limit(decider, path, limit):
    chunk = b"x" * 65536
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    with connect(decider) as connection:
        connection.sendall(
            head(
                path,
                "Content-Type: application/json",
                f"Authorization: Bearer {TOKEN}",
                "Transfer-Encoding: chunked",
            )
        )
        # Never ended: a server that reads a body whole never answers. Loopback's socket
        # buffers take a few MB the server has not read.
        status, sent = answered_before(connection, framed, most=64 * 2**20)
    assert status == 413
    assert sent < 64 * 2**20, "the server read on past the limit"
    assert decider.get("/healthz").status_code == 200


def test_a_placement_within_the_limit_is_answered(decider):
    candidates = [f"node-{index:06d}" for index in range(100_000)]
    body = json.dumps({"replica": REPLICA, "candidates": candidates}).encode()
    assert len(body) < MAX_PLACEMENT_BODY_BYTES
    response = decider.post(
        "/v1/placements", data=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["nodes"]) == 100_000


# --- ids, names and reasons ----------------------------------------------------------------

BAD_BODIES = [
    ("/v1/placements", {"replica": REPLICA, "candidates": ["n1", "x" * 254]}, "candidates.1"),
    ("/v1/placements", {"replica": REPLICA, "candidates": ["\udfff"]}, "candidates.0"),
    ("/v1/placements", {"replica": REPLICA, "candidates": ["n1", "a\nb"]}, "candidates.1"),
    ("/v1/placements", {"replica": REPLICA, "candidates": [".."]}, "candidates.0"),
    ("/v1/placements", {"replica": {**REPLICA, "model": "m" * 300}, "candidates": []}, "model"),
    ("/v1/placements", {"replica": {**REPLICA, "model": "l\u202ea"}, "candidates": []}, "model"),
    ("/v1/reservations", {"id": "a\nb", "replica": REPLICA, "node": "n1"}, "id"),
    ("/v1/reservations", {"id": "team/../x", "replica": REPLICA, "node": "n1"}, "id"),
    ("/v1/reservations", {"id": "x" * 300, "replica": REPLICA, "node": "n1"}, "id"),
    ("/v1/reservations", {"id": "ok", "replica": REPLICA, "node": "n1\u0085"}, "node"),
    ("/v1/domains/rack/r1/hold", {"reason": "power work\u0085"}, "reason"),
    ("/v1/domains/rack/r1/hold", {"reason": "\u202eevil"}, "reason"),
    ("/v1/domains/rack/r1/hold", {"reason": "r" * 513}, "reason"),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD_BODIES)
def test_a_bad_id_name_or_reason_gets_422_naming_the_field(decider, path, body, field):
    # json.dumps writes a lone surrogate as the escape `\udfff`, as a careless client would.
    response = decider.post(
        path, data=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text[:300]
    problems = response.json()["problems"]
    assert any(problem.split(":")[0].endswith(field) for problem in problems), problems


def test_no_bad_id_was_stored(decider):
    stored = [r["id"] for r in decider.get("/v1/reservations").json()["reservations"]]
    assert all("\n" not in rid and ".." not in rid for rid in stored), stored


@pytest.mark.parametrize("gpus", ["4", True, " 4 ", 4.0])
def test_an_integer_is_an_integer(decider, gpus):
    for path, body in (
        ("/v1/placements", {"replica": {**REPLICA, "gpus": gpus}, "candidates": ["n1"]}),
        ("/v1/reservations", {"id": "typed", "replica": {**REPLICA, "gpus": gpus}, "node": "n1"}),
    ):
        response = decider.post(path, body)
        assert response.status_code == 422, (path, response.text[:300])
        assert any(p.startswith("replica.gpus:") for p in response.json()["problems"])


def test_a_facility_file_naming_an_unaddressable_domain_is_refused(tmp_path):
    facility = {**FACILITY, "domains": {"rack/..": {"cap_watts": 1000}}}
    (tmp_path / "facility.yaml").write_text(yaml.safe_dump(facility))
    (tmp_path / "decider.yaml").write_text(
        yaml.safe_dump(
            {
                "prometheus": {"url": "http://127.0.0.1:9"},
                "facility": "facility.yaml",
                "database": "decider.db",
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "decider.main", "--config", str(tmp_path / "decider.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2, result.stderr
    assert "facility.yaml:" in result.stderr and "'..'" in result.stderr, result.stderr


# --- caches bounded by the site, not by callers --------------------------------------------


def rss_bytes(decider: Decider) -> int:
    assert decider.process is not None
    status = Path(f"/proc/{decider.process.pid}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(kib) * 1024


def test_unknown_candidates_are_answered_not_cached(decider):
    """Placements of 40,000 names the site does not know: the answers say so, and the process
    stops growing. Before the fix each such placement kept ~5 MB for good (~40 MB over eight);
    now the size settles within a few placements (glibc's arenas and the collector's timing),
    then stays: 77 → 90 MB over the first six, 90 → 93 MB over the next ten, with a one-off
    peak of 103 MB that the next placement gives back (measured, 2 cores). So the test warms
    up for six, then asks the smallest of the last three sizes after twelve more to be within
    20 MB of the size after warm-up: a leak at the old rate would be 60 MB past it."""

    def place_strangers(round_: int) -> None:
        names = [f"stranger-{round_}-{index}" for index in range(40_000)]
        answer = decider.place(REPLICA, names)
        assert len(answer["nodes"]) == len(names)
        assert answer["order"] == names  # no node is refused for not being known

    for round_ in range(6):
        place_strangers(round_)
    before = rss_bytes(decider)
    sizes = []
    for round_ in range(6, 18):
        place_strangers(round_)
        sizes.append(rss_bytes(decider))
    grown = min(sizes[-3:]) - before
    assert grown < 20 * 2**20, f"grew {grown / 2**20:.1f} MB: {[s // 2**20 for s in sizes]}"
    known = decider.place(REPLICA, ["n1", "stranger-1-1"])  # known ones still answered
    assert [node["node"] for node in known["nodes"]] == ["n1", "stranger-1-1"]


# --- headers ---------------------------------------------------------------------------------


def test_a_huge_header_gets_431(decider):
    with connect(decider) as connection:
        status, _ = answered_before(
            connection,
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n",
            most=2**20 + 64,
        )
    assert status == 431
    assert decider.get("/healthz").status_code == 200


# --- strict JSON in every answer -------------------------------------------------------------


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"a non-finite number in an answer: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_every_answer_is_strict_json(decider):
    answers = [
        decider.get("/v1/domains"),
        decider.get("/v1/domains/rack/r1"),
        decider.get("/v1/domains/pdu/r1-a"),
        decider.get("/v1/headroom", params={"profile": "p4"}),
        decider.get("/v1/profiles/llama"),
        decider.get("/v1/power-capping"),
        decider.get("/v1/shedding"),
        decider.get("/v1/failover", params={"domain": "pdu/r1-a"}),
        decider.get("/v1/reservations"),
        decider.get("/readyz"),
        decider.get("/healthz"),
        decider.get("/openapi.json"),
        decider.post("/v1/placements", {"replica": REPLICA, "candidates": list(NODES)}),
        decider.post(
            "/v1/placements",
            {
                "replica": REPLICA,
                "candidates": list(NODES),
                "profiles": [{"profile": "p4", "gpus": 4}],
            },
        ),
        decider.reserve("strict-1", "n2", REPLICA),
        decider.post("/v1/reservations/strict-1/confirm"),
        decider.post("/v1/domains/row/1/hold", {"reason": "strict JSON"}),
        decider.post("/v1/domains/row/1/release"),
        decider.post(
            "/v1/placements",
            data=b'{"replica": {"power_watts": 1e400}, "candidates": [NaN]}',
            headers={"Content-Type": "application/json"},
        ),
        decider.post("/v1/reservations", {"id": "x"}, token="wrong-token-0123456789"),
        decider.get("/v1/domains/rack/nowhere"),
        decider.post("/-/reload"),
    ]
    assert decider.delete("/v1/reservations/strict-1").status_code == 204
    for response in answers:
        assert response.headers["content-type"].startswith("application/json"), response.url
        strict_json(response.text)
