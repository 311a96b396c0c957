"""The decider's reading of Prometheus on a bad day (issue 16 items 3, 6, 9), as a real
`llmgw-decider` process over real HTTP against a loopback Prometheus stand-in
(tests/decider_harness.py FakePrometheus):

- one bad series (NaN, ±Inf, a negative power, 7.5 GPUs, a bad label) costs its own domain
  or node alone, and is named in `missing`: a rack measured at 40 kW of a 45 kW limit still
  refuses a 6 kW replica while another rack's power reads NaN; and, as a property, no single
  bad series changes the answer for a node outside the domain or node it is about;
- the Prometheus credentials (basic auth, a bearer token, a client certificate over TLS with
  a CA made here) are read from files and never shown: every answer, page and log line of a
  decider whose Prometheus fails, and quotes back what it was sent, is searched for them;
  a URL with a password in it is refused at load, without repeating it;
- a Prometheus that answers 200 and then trickles a byte at a time: the decider's threads
  and connections stay flat, each query ended at its deadline and its connection closed.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decider.snapshot import INVENTORY_PARTS, PARTS
from tests.decider_harness import (
    REPO,
    Decider,
    FakePrometheus,
    Readings,
    decider_yaml,
    metric_value,
    poll,
)
from tests.promstack import free_port

REFRESH = "200ms"
#: Short, so that a part failed whole (the code before issue 16 item 3) is stale within a
#: second, and what it does to the answers shows at once.
READINGS_STALE = "1s"


def place(decider: Decider, replica: dict[str, Any], candidates: list[str]) -> dict[str, Any]:
    return decider.place(replica, candidates)


def by_node(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each node's verdict, without its rank (which depends on the others allowed)."""
    return {
        entry["node"]: {key: value for key, value in entry.items() if key != "scores"}
        for entry in answer["nodes"]
    }


# --- item 3: one bad series -------------------------------------------------------------

SITE_FACILITY: dict[str, Any] = {
    "mode": "enforce",
    "domains": {"rack/r1": {"cap_watts": 45000}},  # rack/r2 has no budget
}
SIX_KW = {"model": "llama", "profile": "tp8", "gpus": 1, "power_watts": 6000}


def test_a_nan_for_a_rack_without_a_budget_leaves_another_rack_protected(tmp_path: Path):
    """The issue's case: rack r1 measured at 40 kW of its 45 kW cap (10 % margin: 40.5 kW)
    refuses a 6 kW replica; one NaN for rack r2, which has no budget, must not change that
    once staleness.readings has passed, and r2 is named in `missing`."""
    fake = FakePrometheus(
        Readings(
            membership={"n1": ["rack/r1"], "n2": ["rack/r2"], "n3": ["rack/r1"]},
            inventory=["rack/r1", "rack/r2"],
            measured={"rack/r1": 40000.0},
            conditions={"rack/r1": "ok", "rack/r2": "ok"},
            gpus={"n1": 8, "n2": 8, "n3": 8},
            limits={"n1": 700.0, "n2": 700.0, "n3": 700.0},
        )
    )
    decider = Decider(
        tmp_path / "decider",
        fake.url,
        SITE_FACILITY,
        refresh_interval=REFRESH,
        readings=READINGS_STALE,
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        before = by_node(place(decider, SIX_KW, ["n1", "n2"]))
        assert not before["n1"]["allowed"] and before["n2"]["allowed"], before

        fake.extra_series["measured"] = [({"kind": "rack", "domain": "r2"}, "NaN")]
        fake.readings.gpus["n3"] = 7.5  # one node's 7.5 GPUs
        bad_rack = '{domain="r2",kind="rack"}'
        decider.wait_domains(
            lambda body: any(bad_rack in line for line in body["missing"]), "r2 named"
        )
        time.sleep(1.5)  # past staleness.readings: a part failed whole would be stale now

        answer = place(decider, SIX_KW, ["n1", "n2"])
        after = by_node(answer)
        assert not after["n1"]["allowed"], answer  # 40 + 6 kW > 40.5 kW: still refused
        assert after["n1"]["reasons"] == [
            "rack r1: 40.0 of 45.0 kW measured, replica needs ~6.0, margin 10%"
        ]
        assert after == before, (before, after)
        measured_line = [line for line in answer["missing"] if PARTS["measured"] in line]
        assert len(measured_line) == 1 and bad_rack in measured_line[0], answer["missing"]
        assert "not a finite number" in measured_line[0]
        gpus_line = [line for line in answer["missing"] if PARTS["gpus"] in line]
        assert len(gpus_line) == 1 and '{node="n3"}: 7.5 GPUs' in gpus_line[0], answer
        # The other nodes' GPU counts are used: n1's estimate is as before (8 GPUs known).
        two_gpus = {"model": "llama", "profile": "tp8", "gpus": 2}
        estimates = by_node(place(decider, two_gpus, ["n1", "n3"]))
        assert estimates["n1"]["estimate_watts"] < estimates["n3"]["estimate_watts"]
        metrics = decider.metrics()
        assert metric_value(metrics, "llmgw_decider_prometheus_up") == 1.0
        assert metric_value(metrics, "llmgw_decider_series_left_out", part="measured") == 1.0
        assert metric_value(metrics, "llmgw_decider_series_left_out", part="gpus") == 1.0
        assert metric_value(metrics, "llmgw_decider_series_left_out", part="limits") == 0.0
    finally:
        decider.close()
        fake.close()


#: The site of the property test: three racks with budgets, two nodes each; r4 has none.
RACKS = {"r1": ["n1", "n2"], "r2": ["n3", "n4"], "r3": ["n5", "n6"]}
NODES = [node for nodes in RACKS.values() for node in nodes]
RACK_OF = {node: rack for rack, nodes in RACKS.items() for node in nodes}
PROPERTY_FACILITY: dict[str, Any] = {
    "mode": "enforce",
    "domains": {f"rack/{rack}": {"cap_watts": 20000} for rack in RACKS},
}
#: r1 nearly full (refused), r2 half (allowed), r3 full (refused): measured power decides.
MEASURED = {"rack/r1": 17000.0, "rack/r2": 9000.0, "rack/r3": 17500.0}
#: No declared power: the estimate reads each node's GPU count and limit.
TWO_GPUS = {"model": "llama", "profile": "tp2", "gpus": 2}


def property_readings() -> Readings:
    return Readings(
        membership={node: [f"rack/{rack}"] for node, rack in RACK_OF.items()},
        inventory=[*(f"rack/{rack}" for rack in RACKS), "rack/r4"],
        measured={**MEASURED, "rack/r4": 1000.0},
        conditions={f"rack/{rack}": "ok" for rack in [*RACKS, "r4"]},
        ages={f"rack/{rack}": 5.0 for rack in RACKS},
        gpus=dict.fromkeys(NODES, 8),
        limits={node: 600.0 + 10 * index for index, node in enumerate(NODES)},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakePrometheus, Decider]]:
    fake = FakePrometheus(property_readings())
    decider = Decider(
        tmp_path_factory.mktemp("property") / "decider",
        fake.url,
        PROPERTY_FACILITY,
        refresh_interval=REFRESH,
        readings=READINGS_STALE,
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        yield fake, decider
    finally:
        decider.close()
        fake.close()


def show(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"


#: A bad value for any part, and those bad only for some parts.
NOT_FINITE = ["NaN", "+Inf", "-Inf", "lots"]
BAD_VALUES: dict[str, list[str]] = {
    "measured": [*NOT_FINITE, "-40"],
    "gpus": [*NOT_FINITE, "7.5", "-8"],
    "limits": [*NOT_FINITE, "-600"],
    "ages": NOT_FINITE,
    "conditions": NOT_FINITE,
    "membership": NOT_FINITE,
    "inventory": NOT_FINITE,
}
DOMAIN_PARTS = ("measured", "ages", "conditions", "inventory")


@st.composite
def bad_series(draw: st.DrawFn) -> tuple[str, dict[str, str], str, set[str]]:
    """(part, labels, value, the nodes the series is about): one bad series for an existing
    rack or node, a rack of no candidate (r4), or with a bad label."""
    part = draw(st.sampled_from(sorted(BAD_VALUES)))
    value = draw(st.sampled_from(BAD_VALUES[part]))
    if part in DOMAIN_PARTS:
        rack = draw(st.sampled_from([*RACKS, "r4"]))
        labels = {"kind": "rack", "domain": rack}
        if part == "conditions":
            labels["condition"] = draw(st.sampled_from(["ok", "hot"]))
        about = set(RACKS.get(rack, []))
        if draw(st.booleans()) and part != "inventory":  # a kind no domain has, value good
            labels["kind"], value, about = "chassis", "1", set()
        return part, labels, value, about
    node = draw(st.sampled_from(NODES))
    labels = {"node": node}
    if part == "membership":
        labels |= {"kind": "rack", "domain": RACK_OF[node]}
    return part, labels, value, {node}


@settings(
    max_examples=14,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bad=bad_series())
def test_no_single_bad_series_changes_the_answer_for_another_domain(site, bad):
    """Issue 16 item 3, as a property: with one bad series injected into the answers, every
    node outside the domain or node the series is about gets the same verdict (allowed,
    reasons, estimate, headroom, condition) as without it; the series is named in `missing`
    (past staleness.readings, where a part failed whole would have gone stale)."""
    fake, decider = site
    fake.extra_series.clear()
    decider.wait_domains(lambda body: not body["missing"], "no bad series")
    baseline = by_node(place(decider, TWO_GPUS, NODES))
    assert [node for node, v in baseline.items() if v["allowed"]] == ["n3", "n4"], baseline

    part, labels, value, about = bad
    fake.extra_series[part] = [(labels, value)]
    decider.wait_domains(
        lambda body: any(show(labels) in line for line in body["missing"]),
        f"{part} series {show(labels)} named in missing",
    )
    time.sleep(1.2)  # past staleness.readings

    answer = place(decider, TWO_GPUS, NODES)
    named = [line for line in answer["missing"] if show(labels) in line]
    assert named and all(PARTS[part] in line for line in named), answer["missing"]
    verdicts = by_node(answer)
    for node in set(NODES) - about:
        assert verdicts[node] == baseline[node], (node, part, labels, value)


# --- item 6: the Prometheus credentials ------------------------------------------------

USER = "decider"
PASSWORD = "pw-Zq81sLk2-never-shown"
TOKEN = "tok-7Hh2pQ-never-shown"
SMALL = {"model": "llama", "profile": "tp1", "gpus": 1, "power_watts": 500}


def plain_site() -> Readings:
    return Readings(
        membership={"n1": ["rack/r1"], "n2": ["rack/r1"]},
        inventory=["rack/r1"],
        measured={"rack/r1": 1000.0},
        conditions={"rack/r1": "ok"},
        gpus={"n1": 8, "n2": 8},
        limits={"n1": 700.0, "n2": 700.0},
    )


def everything_shown(decider: Decider) -> dict[str, str]:
    """Every answer a person or a scheduler can read, and the whole log."""
    shown = {path: decider.get(path).text for path in ("/readyz", "/v1/domains", "/", "/metrics")}
    response = decider.post("/v1/placements", {"replica": SMALL, "candidates": ["n1", "n2"]})
    shown["/v1/placements"] = response.text
    shown["reservation"] = decider.reserve("r-1", "n1", SMALL).text
    shown["log"] = decider.log()
    return shown


def assert_never_shown(decider: Decider, secrets: list[str]) -> dict[str, str]:
    shown = everything_shown(decider)
    for where, text in shown.items():
        for secret in secrets:
            assert secret not in text, f"{where} shows a secret: {text[:2000]}"
    return shown


def fail_every_way(fake: FakePrometheus, decider: Decider) -> None:
    """The stand-in answers 500 quoting the Authorization header it was sent, until every
    part is stale and its error shown in `missing`; then it goes down altogether."""
    fake.set("error")
    decider.wait_domains(
        lambda body: (
            len(body["missing"]) == len(PARTS) - len(INVENTORY_PARTS)  # the readings
            and all("HTTP error" in line for line in body["missing"])
        ),
        "every reading part stale with its HTTP error",
    )


def secrets_test(
    tmp_path: Path, fake: FakePrometheus, http: dict[str, Any], secrets: list[str]
) -> None:
    decider = Decider(
        tmp_path / "decider",
        fake.url,
        {"mode": "enforce", "domains": {"rack/r1": {"cap_watts": 20000}}},
        refresh_interval=REFRESH,
        readings=READINGS_STALE,
        prometheus_http=http,
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()  # authenticated: every part read
        assert_never_shown(decider, secrets)

        fail_every_way(fake, decider)
        shown = assert_never_shown(decider, secrets)
        # The search is not vacuous: each place carries the server's quote of what it was
        # sent, with the secret redacted.
        for where in ("/readyz", "/v1/domains", "/", "/v1/placements", "log"):
            assert "Authorization: " in shown[where] and "[redacted]" in shown[where], where
        assert "[redacted]" in json.loads(shown["/v1/placements"])["missing"][0]

        # Credentials refused (a rotated password, a revoked token): 401s quoting them.
        fake.set("ok")
        fake.require_authorization = "Basic bm90LXRoaXM="
        decider.wait_domains(
            lambda body: body["missing"] and all("HTTP 401" in m for m in body["missing"]),
            "every reading part stale with its 401",
        )
        assert_never_shown(decider, secrets)
        fake.set("down")
        decider.wait_domains(
            lambda body: body["missing"] and all("cannot reach" in m for m in body["missing"]),
            "unreachable",
        )
        assert_never_shown(decider, secrets)
    finally:
        decider.close()


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()


def test_basic_auth_credentials_are_never_shown(tmp_path: Path):
    (tmp_path / "decider").mkdir()
    (tmp_path / "decider" / "prometheus.password").write_text(PASSWORD + "\n")
    fake = FakePrometheus(plain_site())
    fake.require_authorization = basic(PASSWORD)
    try:
        http = {"basic_auth": {"username": USER, "password_file": "prometheus.password"}}
        secrets_test(tmp_path, fake, http, [PASSWORD, basic(PASSWORD).split()[1]])
    finally:
        fake.close()


def test_a_bearer_token_is_never_shown(tmp_path: Path):
    (tmp_path / "decider").mkdir()
    (tmp_path / "decider" / "prometheus.token").write_text(TOKEN)
    fake = FakePrometheus(plain_site())
    fake.require_authorization = f"Bearer {TOKEN}"
    try:
        http = {"authorization": {"type": "Bearer", "credentials_file": "prometheus.token"}}
        secrets_test(tmp_path, fake, http, [TOKEN])
    finally:
        fake.close()


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=llmgw test CA",
        cwd=directory,
    )
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        openssl(
            "req",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=directory,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            *ext,
            cwd=directory,
        )


def test_tls_with_a_client_certificate_and_basic_auth_shows_no_secret(tmp_path: Path):
    certificates = tmp_path / "decider" / "tls"
    make_certificates(certificates)
    (tmp_path / "decider" / "prometheus.password").write_text(PASSWORD)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certificates / "ca.pem")
    server.load_cert_chain(certificates / "server.pem", certificates / "server.key")
    server.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer
    fake = FakePrometheus(plain_site(), tls=server)
    fake.require_authorization = basic(PASSWORD)
    assert fake.url.startswith("https://127.0.0.1:")
    key_line = (certificates / "client.key").read_text().splitlines()[1]
    try:
        http = {
            "basic_auth": {"username": USER, "password_file": "prometheus.password"},
            "tls_config": {
                "ca_file": "tls/ca.pem",
                "cert_file": "tls/client.pem",
                "key_file": "tls/client.key",
            },
        }
        secrets_test(tmp_path, fake, http, [PASSWORD, basic(PASSWORD).split()[1], key_line])
    finally:
        fake.close()


def test_tls_without_the_ca_is_refused_and_says_why(tmp_path: Path):
    certificates = tmp_path / "decider" / "tls"
    make_certificates(certificates)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certificates / "server.pem", certificates / "server.key")
    fake = FakePrometheus(plain_site(), tls=server)
    decider = Decider(tmp_path / "decider", fake.url, {"mode": "observe"}, refresh_interval=REFRESH)
    try:
        ready = decider.start(wait_ready=True).wait_ready()
        assert ready["prometheus_up"] is False
        assert any("CERTIFICATE_VERIFY_FAILED" in line for line in ready["missing"]), ready
    finally:
        decider.close()
        fake.close()


def check_config(tmp_path: Path, prometheus: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    config = decider_yaml("http://127.0.0.1:9090", listen=f"127.0.0.1:{free_port()}")
    config["prometheus"] = prometheus
    (tmp_path / "facility.yaml").write_text("mode: observe\n")
    (tmp_path / "decider.token").write_text("a-token-for-mutating-calls-0123456789\n")
    (tmp_path / "decider.token").chmod(0o600)
    (tmp_path / "decider.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "decider.main", "--config", str(tmp_path / "decider.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("prometheus", "says"),
    [
        ({"url": f"http://{USER}:{PASSWORD}@127.0.0.1:9090"}, "basic_auth.password_file"),
        (
            {
                "url": "http://127.0.0.1:9090",
                "basic_auth": {"username": USER, "password": PASSWORD},
            },
            "name it in prometheus.basic_auth.password_file",
        ),
        (
            {"url": "http://127.0.0.1:9090", "authorization": {"credentials": PASSWORD}},
            "name it in prometheus.authorization.credentials_file",
        ),
    ],
    ids=["password in the URL", "inline password", "inline token"],
)
def test_a_secret_written_into_decider_yaml_is_refused_without_repeating_it(
    tmp_path: Path, prometheus: dict[str, Any], says: str
):
    done = check_config(tmp_path, prometheus)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr, done.stderr
    assert "decider.yaml:" in done.stderr
    assert PASSWORD not in done.stderr + done.stdout


# --- item 9: a trickling Prometheus ----------------------------------------------------


def connections_to(process: psutil.Process, port: int) -> int:
    listing = getattr(process, "net_connections", None) or process.connections
    return sum(1 for c in listing(kind="tcp") if c.raddr and c.raddr.port == port)


def test_a_trickling_prometheus_leaks_no_threads_and_no_connections(tmp_path: Path):
    """200 at once, then a byte every 0.3 s: the read timeout (0.5 s) never trips. Each
    query is ended at its total deadline (timeout × 2 + 0.5 s = 1.5 s) and its connection
    closed, so over ~12 refreshes threads and connections stay flat (before: +9 threads and
    +9 connections a refresh, rising without end)."""
    fake = FakePrometheus(plain_site())
    fake.trickle_s = 0.3
    decider = Decider(
        tmp_path / "decider",
        fake.url,
        {"mode": "observe"},
        refresh_interval=REFRESH,
        timeout="500ms",
        retries=0,
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        assert decider.process is not None
        process = psutil.Process(decider.process.pid)
        fake.set("trickle")
        poll(
            lambda: metric_value(decider.metrics(), "llmgw_decider_prometheus_up") == 0.0,
            "the trickled refresh to fail",
        )
        samples: list[tuple[float, int, int]] = []
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < 21.0:
            samples.append((elapsed, process.num_threads(), connections_to(process, fake.port)))
            time.sleep(0.25)
        first = [s for s in samples if s[0] < 7.0]
        last = [s for s in samples if s[0] >= 14.0]
        threads_before, threads_after = max(s[1] for s in first), max(s[1] for s in last)
        connections_before = max(s[2] for s in first)
        connections_after = max(s[2] for s in last)
        figures = (
            f"threads {threads_before} -> {threads_after}, "
            f"connections {connections_before} -> {connections_after}"
        )
        print(figures)
        assert threads_after <= threads_before + 2, figures
        assert connections_after <= connections_before + 2, figures
        # At most one refresh's queries in flight at any time.
        assert max(s[2] for s in samples) <= len(PARTS), samples
        ready = decider.get("/readyz").json()
        log = decider.log()
        assert "no complete answer from" in log and "the query's deadline" in log, ready
    finally:
        decider.close()
        fake.close()
