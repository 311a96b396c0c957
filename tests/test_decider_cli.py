"""`llmgw-facility` over a running decider (llmgw_facility/, docs/decider.md), real HTTP.

One real `llmgw-decider` subprocess for the module, on a free loopback port, in enforce
mode, reading a fake Prometheus served here that knows the nodes' membership, GPU counts
and conditions and fails every other query (so answers carry `missing`, and placement
answers anyway). Two replicas reserved through the API fill rack r1, so a third is refused
with the figures. The CLI runs in-process (`main([...])`); tests assert on its lines and
exit status, including an unreachable decider, a silent one, a wrong token and a 5xx.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests

from llmgw_facility.cli import main
from llmgw_facility.client import TOKEN_ENV, URL_ENV
from tests.promstack import free_port

TOKEN = "cli-test-token-0123456789"
DEADLINE_S = 60.0

FACILITY = """\
defaults: {{margin: 0.10, derating: 0.80}}
domains:
  row/12: {{cap_watts: 100000, other_watts: 1000}}
  rack/r1: {{cap_watts: 10000}}
  rack/r2: {{cap_watts: 10000}}
  rack/r3: {{cap_watts: 10000}}
profiles:
  tp4: {{gpus: 4, power_watts: 4000}}
mode: {mode}
"""

#: node → (rack, pdu); every node is in row 12. n5 is unknown to Prometheus.
NODES = {"n1": ("r1", "p1"), "n2": ("r1", "p1"), "n3": ("r2", "p2"), "n4": ("r3", "p3")}
CONDITIONS = {("rack", "r1"): "ok", ("rack", "r2"): "warm", ("rack", "r3"): "hot"}
CONDITIONS[("row", "12")] = "ok"


# --- a fake Prometheus: membership, GPU counts, conditions; every other query fails ----------


def vector(series: list[dict[str, str]], value: float = 1.0) -> dict[str, Any]:
    result = [{"metric": labels, "value": [time.time(), str(value)]} for labels in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def prometheus_answer(query: str) -> dict[str, Any] | None:
    if "llmgw:node_domain:membership[" in query:
        return vector(
            [
                {"node": node, "kind": kind, "domain": name}
                for node, (rack, pdu) in NODES.items()
                for kind, name in (("rack", rack), ("pdu", pdu), ("row", "12"))
            ]
        )
    if "llmgw:node_gpus:count[" in query:
        return vector([{"node": node} for node in NODES], 16)
    if "llmgw_domain_condition[" in query:
        return vector(
            [
                {"kind": kind, "domain": name, "condition": condition}
                for (kind, name), condition in CONDITIONS.items()
            ]
        )
    return None


class FakePrometheus:
    """`/api/v1/query` as above; `/v1/headroom` an HTML page; any other path 503 with a JSON
    `detail`, as the decider answers when its database fails."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/api/v1/query":
                    answer = prometheus_answer(parse_qs(url.query).get("query", [""])[0])
                    status = 200 if answer is not None else 500
                    body = answer if answer is not None else {"status": "error"}
                elif url.path == "/v1/headroom":  # a page, as a proxy or another service sends
                    self.reply(200, b"<html>Prometheus Time Series Collection</html>", "text/html")
                    return
                else:
                    status, body = 503, {"detail": "nothing was changed: disk I/O error"}
                self.reply(status, json.dumps(body).encode(), "application/json")

            def reply(self, status: int, data: bytes, content_type: str) -> None:
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


# --- the decider ------------------------------------------------------------------------------


@dataclass
class Site:
    url: str
    directory: Path
    token_file: Path
    prometheus: FakePrometheus

    def post(self, path: str, body: Any = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return requests.post(self.url + path, json=body, headers=headers, timeout=10)

    def set_mode(self, mode: str) -> None:
        (self.directory / "facility.yaml").write_text(FACILITY.format(mode=mode))
        answer = self.post("/-/reload")
        assert answer.status_code == 200, answer.text


def decider_command(config: Path) -> list[str]:
    script = Path(sys.executable).with_name("llmgw-decider")
    if script.exists():
        return [str(script), "--config", str(config)]
    return [sys.executable, "-m", "decider.main", "--config", str(config)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory = tmp_path_factory.mktemp("decider")
    prometheus = FakePrometheus()
    port = free_port()
    token_file = directory / "decider.token"
    token_file.write_text(TOKEN + "\n")
    (directory / "facility.yaml").write_text(FACILITY.format(mode="enforce"))
    config = directory / "decider.yaml"
    config.write_text(
        f"prometheus: {{url: '{prometheus.url}', timeout: 2s, retries: 0}}\n"
        "facility: facility.yaml\n"
        f"listen: 127.0.0.1:{port}\n"
        "database: decider.db\n"
        "token_file: decider.token\n"
        "refresh_interval: 2s\n"
    )
    log = (directory / "decider.log").open("w")
    process = subprocess.Popen(
        decider_command(config), stdout=log, stderr=subprocess.STDOUT, cwd=directory
    )
    url = f"http://127.0.0.1:{port}"
    site = Site(url, directory, token_file, prometheus)
    try:
        wait_for_membership(url, process, directory / "decider.log")
        for reservation in ("res-a", "res-b"):  # 2 × 4 kW: rack r1 at 8.0 of its 9.0 kW limit
            answer = site.post(
                "/v1/reservations",
                {
                    "id": reservation,
                    "node": "n1",
                    "replica": {"model": "llama-70b", "profile": "tp4", "gpus": 4},
                },
            )
            assert answer.status_code == 201, answer.text
            confirmed = site.post(f"/v1/reservations/{reservation}/confirm")  # no TTL expiry
            assert confirmed.status_code == 200, confirmed.text
        yield site
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        prometheus.close()


def wait_for_membership(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the decider serves and has read the nodes' domains (pdu/p1 is known only so)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"llmgw-decider exited with {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(requests.RequestException):
            domains = requests.get(url + "/v1/domains", timeout=2).json()["domains"]
            if any(d["kind"] == "pdu" and d["domain"] == "p1" for d in domains):
                return
        time.sleep(0.1)
    pytest.fail(
        f"llmgw-decider did not read the membership within {DEADLINE_S:g}s:\n{log.read_text()}"
    )


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    """(exit status, stdout lines, stderr) of `llmgw-facility ARGS`."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def one_line_error(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


# --- the domain table -------------------------------------------------------------------------


def test_facility_prints_the_domain_table_site_to_pdu(site, capsys):
    code, lines, err = run(capsys, "facility", "--decider", site.url)
    assert code == 0, err
    assert lines[:9] == [
        "DOMAIN   CONDITION  CAP kW  RESERVED kW  MEASURED kW  HEADROOM kW  CAP-LOAD kW  HELD",
        "row/12   ok          100.0          8.0            -         81.0         91.0  -",
        "rack/r1  ok           10.0          8.0            -          1.0          2.0  -",
        "rack/r2  warm         10.0          0.0            -          9.0         10.0  -",
        "rack/r3  hot          10.0          0.0            -          9.0         10.0  -",
        "pdu/p1   unknown         -          8.0            -            -            -  -",
        "pdu/p2   unknown         -          0.0            -            -            -  -",
        "pdu/p3   unknown         -          0.0            -            -            -  -",
        "missing:",
    ]
    # HEADROOM is the room placement allows: the limit (cap less the 10 % margin) less the
    # load (row 12: 8 kW reserved + 1 kW other_watts); CAP-LOAD the cap less the load.
    notes = lines[9:]
    assert any(
        note.startswith("  - domain measured power (llmgw_domain_measured_watts)") for note in notes
    )
    assert not any("membership" in note for note in notes)


def test_facility_json_is_the_decider_answer(site, capsys):
    code, lines, _ = run(capsys, "facility", "--json", "--decider", site.url)
    assert code == 0
    answer = json.loads("\n".join(lines))
    assert answer == requests.get(site.url + "/v1/domains", timeout=10).json()


# --- explain-placement ------------------------------------------------------------------------


def test_explain_placement_gives_each_node_its_verdict_and_reasons(site, capsys):
    code, lines, err = run(
        capsys,
        "explain-placement",
        "--decider",
        site.url,
        "--model",
        "llama-70b",
        "--profile",
        "tp4",
        "--gpus",
        "4",
        *("n1", "n3", "n4", "n5", "n2"),
    )
    assert code == 0, err
    refusal = "    - rack r1: 8.0 of 10.0 kW reserved, replica needs ~4.0, margin 10%"
    assert lines[:13] == [
        "enforce mode: a replica of llama-70b (profile tp4, 4 GPUs) on 5 candidates",
        "NODE  VERDICT  ESTIMATE  CONDITION          HEADROOM",
        "n1    refused  ~4.0 kW   condition ok       headroom -3.0 kW",
        refusal,
        "n3    allowed  ~4.0 kW   condition warm     headroom 5.0 kW   rank 2",
        "n4    refused  ~4.0 kW   condition hot      headroom 5.0 kW",
        "    - rack r3 hot",
        "n5    allowed  ~4.0 kW   condition unknown  no budget         rank 1",
        "n2    refused  ~4.0 kW   condition ok       headroom -3.0 kW",
        refusal,
        "order, best first: n5, n3",
        "2/5 nodes allowed (2 power_cap, 1 hot)",
        "missing:",
    ]
    assert (
        "  - membership unknown for node n5 (no llmgw:node_domain:membership): no domain "
        "limits them" in lines
    )


def test_explain_placement_in_observe_mode_says_what_it_would_refuse(site, capsys):
    site.set_mode("observe")
    try:
        code, lines, err = run(
            capsys,
            "explain-placement",
            "--decider",
            site.url,
            "--model",
            "llama-70b",
            "--profile",
            "tp4",
            "--gpus",
            "4",
            "--power-watts",
            "1500",
            "n4",
            "n3",
        )
    finally:
        site.set_mode("enforce")
    assert code == 0, err
    assert lines[:7] == [
        "observe mode: a replica of llama-70b (profile tp4, 4 GPUs) on 2 candidates",
        "NODE  VERDICT  ESTIMATE  CONDITION       HEADROOM",
        "n4    allowed  ~1.5 kW   condition hot   headroom 7.5 kW  rank 1",
        "    - would refuse: rack r3 hot",
        "n3    allowed  ~1.5 kW   condition warm  headroom 7.5 kW  rank 2",
        "order, best first: n4, n3",
        "observe mode: 2/2 nodes allowed, 1 would be refused (1 hot)",
    ]


def test_a_bad_request_gets_the_deciders_own_words(site, capsys):
    code, lines, err = run(
        capsys,
        "explain-placement",
        "--decider",
        site.url,
        *("--model", "m", "--profile", "tp4", "--gpus", "-1", "n1", "n1"),
    )
    assert code == 1
    assert lines == []
    assert one_line_error(err) == (
        "llmgw-facility explain-placement: the decider answered HTTP 422: replica.gpus: Input "
        "should be greater than or equal to 0; candidates: Value error, node 'n1' is listed "
        "more than once"
    )


# --- hold and release -------------------------------------------------------------------------


def test_hold_refuses_the_racks_nodes_until_released(site, capsys):
    args = ("--decider", site.url, "--token-file", str(site.token_file))
    code, lines, err = run(capsys, "hold", "r2", "--reason", "cooling work", *args)
    assert (code, lines) == (0, ["held rack/r2: cooling work (no new placements on its nodes)"]), (
        err
    )
    try:
        _, lines, _ = run(capsys, "facility", "--decider", site.url)
        assert (
            "rack/r2  warm         10.0          0.0            -          9.0         10.0  "
            "cooling work" in lines
        )
        _, lines, _ = run(
            capsys,
            "explain-placement",
            *("--decider", site.url, "--model", "m", "--profile", "tp4", "--gpus", "4", "n3"),
        )
        assert "    - rack r2 held: cooling work" in lines
        assert "0/1 nodes allowed (1 held)" in lines
    finally:
        code, lines, err = run(capsys, "release", "rack/r2", *args)
    assert (code, lines) == (0, ["released rack/r2 (it was held: cooling work)"]), err
    code, lines, _ = run(capsys, "release", "rack/r2", *args)
    assert (code, lines) == (0, ["rack/r2 is not held; nothing to release"])


def test_the_token_and_the_address_may_come_from_the_environment(site, capsys, monkeypatch):
    monkeypatch.setenv(URL_ENV, site.url)
    monkeypatch.setenv(TOKEN_ENV, str(site.token_file))
    code, lines, err = run(capsys, "hold", "pdu/p3", "--reason", "PDU firmware")
    assert (code, lines) == (0, ["held pdu/p3: PDU firmware (no new placements on its nodes)"]), err
    code, lines, err = run(capsys, "release", "pdu/p3")
    assert (code, lines) == (0, ["released pdu/p3 (it was held: PDU firmware)"]), err


def test_a_wrong_or_missing_token_is_one_clear_line(site, capsys, tmp_path):
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token-0123456789\n")
    code, lines, err = run(
        capsys, "hold", "r2", "--reason", "x", "--decider", site.url, "--token-file", str(wrong)
    )
    assert (code, lines) == (1, [])
    assert one_line_error(err) == (
        f"llmgw-facility hold: the decider refused the call (HTTP 401): the token in {wrong} "
        "is not the decider's"
    )
    code, _, err = run(capsys, "hold", "r2", "--reason", "x", "--decider", site.url)
    assert code == 1
    assert one_line_error(err) == (
        "llmgw-facility hold: the decider refused the call (HTTP 401): give the decider's "
        f"token with --token-file FILE or ${TOKEN_ENV}"
    )
    missing = tmp_path / "absent.token"
    code, _, err = run(
        capsys, "hold", "r2", "--reason", "x", "--decider", site.url, "--token-file", str(missing)
    )
    assert code == 2
    assert one_line_error(err).startswith(
        f"llmgw-facility hold: cannot read the token file {missing}: "
    )
    accented = tmp_path / "accented.token"
    accented.write_text("jeton-très-secret-0123456789\n")
    code, _, err = run(
        capsys, "hold", "r2", "--reason", "x", "--decider", site.url, "--token-file", str(accented)
    )
    assert code == 2
    assert one_line_error(err) == (
        f"llmgw-facility hold: the token in {accented} is not printable ASCII: an HTTP header "
        "cannot carry it"
    )
    _, lines, _ = run(capsys, "facility", "--decider", site.url)
    assert not any(line.startswith("rack/r2") and line.endswith("  x") for line in lines)


def test_holding_an_unknown_domain_names_it(site, capsys):
    args = ("--decider", site.url, "--token-file", str(site.token_file))
    code, _, err = run(capsys, "hold", "rack/r99", "--reason", "x", *args)
    assert code == 1
    assert one_line_error(err) == (
        "llmgw-facility hold: the decider answered HTTP 404: no domain rack/r99: neither in "
        "the facility file nor among the nodes' domains"
    )
    with pytest.raises(SystemExit) as exit_:
        main(["hold", "cabinet/c1", "--reason", "x", *args])
    assert exit_.value.code == 2
    assert "'cabinet/c1' is not kind/name" in capsys.readouterr().err


# --- headroom ---------------------------------------------------------------------------------


def test_headroom_per_domain_and_what_binds(site, capsys):
    code, lines, err = run(capsys, "headroom", "--profile", "tp4", "--decider", site.url)
    assert code == 0, err
    r1 = "power: rack r1 has 1.0 kW left, a replica needs ~4.0"
    r2 = "power: rack r2 has 1.0 kW left, a replica needs ~4.0"
    assert lines[:9] == [
        "profile tp4: how many more replicas fit, per domain",
        "DOMAIN   FITS  WHAT BINDS",
        f"row/12      2  {r1} (2 nodes); {r2}; rack r3 hot",
        f"rack/r1     0  {r1} (2 nodes)",
        f"rack/r2     2  {r2}",
        "rack/r3     0  rack r3 hot",
        f"pdu/p1      0  {r1} (2 nodes)",
        f"pdu/p2      2  {r2}",
        "pdu/p3      0  rack r3 hot",
    ]
    code, _, err = run(capsys, "headroom", "--profile", "nope", "--decider", site.url)
    assert code == 1
    assert one_line_error(err) == (
        "llmgw-facility headroom: the decider answered HTTP 404: no profile 'nope' in the "
        "facility file (profiles: tp4)"
    )


# --- a decider that cannot answer -------------------------------------------------------------


def test_an_unreachable_decider_is_one_line_and_exit_3(capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, lines, err = run(capsys, "facility", "--decider", url)
    assert (code, lines) == (3, [])
    assert one_line_error(err) == (
        f"llmgw-facility facility: cannot reach the decider at {url}: Connection refused (is "
        f"llmgw-decider running there? set the address with --decider URL or ${URL_ENV})"
    )


def test_a_silent_decider_times_out(capsys):
    with socket.socket() as listener:  # accepts connections into its backlog, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        code, _, err = run(
            capsys, "headroom", "--profile", "tp4", "--decider", url, "--timeout", "0.3"
        )
        assert time.monotonic() - started < 10
    assert code == 3
    assert one_line_error(err) == (
        f"llmgw-facility headroom: no answer from the decider at {url} within 0.3s"
    )


def test_a_server_error_shows_its_detail(site, capsys):
    code, _, err = run(capsys, "facility", "--decider", site.prometheus.url)
    assert code == 1
    assert one_line_error(err) == (
        "llmgw-facility facility: the decider answered HTTP 503: nothing was changed: disk I/O "
        "error"
    )


def test_an_answer_that_is_not_json_is_not_the_decider(site, capsys):
    url = site.prometheus.url
    code, _, err = run(capsys, "headroom", "--profile", "tp4", "--decider", url)
    assert code == 3
    assert one_line_error(err) == (
        f"llmgw-facility headroom: {url}/v1/headroom answered HTTP 200 with text/html, not "
        f"JSON: is {url} the decider?"
    )


def test_a_bad_decider_address_is_a_usage_error(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        main(["facility", "--decider", "127.0.0.1:9851"])
    assert exit_.value.code == 2
    assert "'127.0.0.1:9851' is not an http:// or https:// URL" in capsys.readouterr().err
    monkeypatch.setenv(URL_ENV, "decider:9851")
    with pytest.raises(SystemExit) as exit_:
        main(["facility"])
    assert exit_.value.code == 2
    assert f"${URL_ENV}: 'decider:9851' is not an http" in capsys.readouterr().err


def test_demo_and_simulate_are_commands(capsys):
    for command in ("demo", "simulate"):
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0
        assert "usage: llmgw-facility" in capsys.readouterr().out


# --- check-config --decider-config ------------------------------------------------------------


def test_check_config_validates_a_decider_config_with_its_files(site, capsys, tmp_path):
    config = site.directory / "decider.yaml"
    code, lines, err = run(capsys, "check-config", "--decider-config", str(config))
    assert code == 0, err
    assert lines[0].startswith(f"{config}: ok (listen 127.0.0.1:")
    assert f"facility {site.directory / 'facility.yaml'}: 4 domains, mode enforce" in lines[0]
    bad = tmp_path / "decider.yaml"
    bad.write_text("facility: facility.yaml\ntoken_file: short.token\nrefresh_interval: 5m\n")
    (tmp_path / "facility.yaml").write_text("mode: enforced\n")
    (tmp_path / "short.token").write_text("short\n")
    code, lines, err = run(capsys, "check-config", "--decider-config", str(bad))
    assert (code, lines) == (1, [])
    assert f"{bad}:1: (top level): Value error, refresh_interval 300s must be shorter" in err
    bad.write_text("facility: facility.yaml\ntoken_file: short.token\n")
    code, lines, err = run(capsys, "check-config", "--decider-config", str(bad))
    assert code == 1
    assert f"{tmp_path / 'facility.yaml'}:1: mode: Input should be 'observe' or 'enforce'" in err
    assert f"{tmp_path / 'short.token'}:1: the token must be one line of at least 16" in err
    assert "Traceback" not in err


def test_the_example_decider_yaml_holds_the_defaults():
    from decider import config as decider_config

    example = Path(__file__).resolve().parent.parent / "examples" / "decider.yaml"
    loaded = decider_config.load(example)
    defaults = decider_config.DeciderConfig().relative_to(example.parent)
    assert loaded.token_file == example.parent / "decider.token"
    assert loaded.model_copy(update={"token_file": None}) == defaults
    assert loaded.facility == example.parent / "facility.yaml"
