"""`llmgw-facility check-config --prometheus` (llmgw_facility/signal_check.py) against a real
Prometheus on loopback: each site signal's query is run there and held against the facility
file's declared domains.

Prometheus scrapes a small metrics page served here (tests/promstack.metrics_target) with a
DCIM's rack inlet sensors and a cooling unit's alarms. The facility file's signals: one good
(every series onto a declared rack, every declared rack covered), one returning no series,
one whose series map onto an undeclared row (and leave a declared row uncovered), and, in a
second file, one with a PromQL syntax error that the file's own token check lets through,
and a signal per phase of three-phase PDUs against the phases each PDU declares.
Then Prometheus down, and one that accepts connections and never answers (the deadline).
The CLI runs in-process (`main([...])`); tests assert on its lines and exit status.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from llmgw_facility.cli import main
from tests.promstack import free_port, metrics_target, prometheus

#: Generous for two busy cores: Prometheus scrapes every second.
SCRAPED_WITHIN_S = 60.0

EXPOSITION = b"""\
# TYPE dcim_rack_inlet_temperature_celsius gauge
dcim_rack_inlet_temperature_celsius{rack="r1",sensor="top"} 24.5
dcim_rack_inlet_temperature_celsius{rack="r1",sensor="bottom"} 21
dcim_rack_inlet_temperature_celsius{rack="r2",sensor="top"} 25
# TYPE crac_alarm gauge
crac_alarm{cabinet_row="12",unit="crac-1"} 0
crac_alarm{cabinet_row="hall-z",unit="crac-9"} 1
crac_alarm{unit="crac-spare"} 0
# TYPE pdu_phase_power_watts gauge
pdu_phase_power_watts{pdu="p1",phase="L1"} 2100
pdu_phase_power_watts{pdu="p1",phase="L2"} 1900
pdu_phase_power_watts{pdu="p1",phase="L4"} 5
pdu_phase_power_watts{pdu="p2",phase="L1"} 800
"""

FACILITY = """\
mode: observe
domains:
  rack/r1: {cap_watts: 13840}
  rack/r2: {cap_watts: 13840}
  pdu/p1: {cap_watts: 16000}
  row/12: {cap_watts: 100000}
  row/13: {cap_watts: 100000}
signals:
  inlet_temp_c: {query: 'max by (rack) (dcim_rack_inlet_temperature_celsius)', domain_label: rack, stale_after: 1m}
  power_watts: {query: 'sum by (pdu) (pdu_outlet_power_watts)', domain_label: pdu}
  cooling_alarm: {query: 'max by (cabinet_row) (crac_alarm)', domain_label: cabinet_row, kind: row}
"""  # noqa: E501 - a facility file as a site writes it, one signal a line

#: Brackets and strings balance, so the file loads; Prometheus refuses the PromQL.
SYNTAX_ERROR = """\
mode: observe
domains:
  rack/r1: {cap_watts: 13840}
signals:
  inlet_temp_c: {query: 'max bi (rack) (dcim_rack_inlet_temperature_celsius)', domain_label: rack}
"""


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus")
    with (
        metrics_target(lambda: EXPOSITION) as target,
        prometheus(workdir, rule_files=[], scrape_targets={"site": [target]}) as server,
    ):
        deadline = time.monotonic() + SCRAPED_WITHIN_S
        query = (
            "count(dcim_rack_inlet_temperature_celsius) + count(crac_alarm) "
            "+ count(pdu_phase_power_watts)"
        )
        while True:
            answer = requests.get(
                f"{server.url}/api/v1/query", params={"query": query}, timeout=5
            ).json()
            result = answer["data"]["result"]
            if result and result[0]["value"][1] == "10":
                break
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus has not scraped the page in {SCRAPED_WITHIN_S:.0f} s")
            time.sleep(0.2)
        yield server.url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    code = main(["check-config", *argv])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err.splitlines()


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


@pytest.mark.servers
def test_each_signal_is_run_and_held_against_the_declared_domains(prometheus_url, capsys, tmp_path):
    facility = write(tmp_path, "facility.yaml", FACILITY)
    code, out, err = run(capsys, "--facility", str(facility), "--prometheus", prometheus_url)
    assert code == 1, (out, err)
    assert out[0].startswith(f"{facility}: ok (5 domains")
    assert out[1:] == [
        f"{facility}: signals.inlet_temp_c: ok: 2 series onto 2 declared racks (rack/r1, rack/r2)"
    ]
    assert err == [
        f"{facility}: signals.power_watts: returns no series: nothing in Prometheus matches "
        "the query (is the exporter scraped, and its metric and labels spelled as in the "
        "query?)",
        "  query: sum by (pdu) (pdu_outlet_power_watts)",
        f"{facility}: signals.cooling_alarm: does not map onto the declared rows: 3 series, "
        "2 onto none of them; 1 declared row with no series",
        '  series {cabinet_row="hall-z"}: row/hall-z is not declared in the facility file',
        "  series {}: no cabinet_row label: the rule drops it",
        "  declared, no series: row/13",
        "  query: max by (cabinet_row) (crac_alarm)",
    ]


@pytest.mark.servers
def test_a_good_file_passes_and_the_decider_config_brings_its_prometheus(
    prometheus_url, capsys, tmp_path
):
    good = FACILITY.replace("  row/13: {cap_watts: 100000}\n", "  row/hall-z: {}\n")
    good = good.replace("(crac_alarm)", '(crac_alarm{cabinet_row!=""})')
    good = good.replace(
        "  power_watts: {query: 'sum by (pdu) (pdu_outlet_power_watts)', domain_label: pdu}\n", ""
    )
    facility = write(tmp_path, "facility.yaml", good)
    password = write(tmp_path, "prometheus.password", "not-checked-by-this-prometheus\n")
    decider = write(
        tmp_path,
        "decider.yaml",
        f"prometheus:\n  url: {prometheus_url}\n  timeout: 5s\n"
        f"  basic_auth: {{username: check, password_file: {password.name}}}\n"
        "facility: facility.yaml\n",
    )
    code, out, err = run(capsys, "--decider-config", str(decider), "--prometheus")
    assert (code, err) == (0, [])
    assert out[1:] == [
        f"{facility}: signals.inlet_temp_c: ok: 2 series onto 2 declared racks (rack/r1, rack/r2)",
        f"{facility}: signals.cooling_alarm: ok: 2 series onto 2 declared rows "
        "(row/12, row/hall-z)",
    ]


@pytest.mark.servers
def test_a_query_prometheus_refuses_is_a_broken_signal(prometheus_url, capsys, tmp_path):
    facility = write(tmp_path, "facility.yaml", SYNTAX_ERROR)
    code, out, err = run(capsys, "--facility", str(facility), "--prometheus", prometheus_url)
    assert code == 1, (out, err)
    assert len(err) == 2, err
    assert err[0].startswith(
        f"{facility}: signals.inlet_temp_c: the query fails: {prometheus_url} answered "
        "HTTP 400: bad_data: "
    )
    assert "parse error" in err[0]
    assert err[1] == "  query: max bi (rack) (dcim_rack_inlet_temperature_celsius)"


def test_prometheus_down_is_said_so_with_status_3(capsys, tmp_path):
    facility = write(tmp_path, "facility.yaml", FACILITY)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = run(capsys, "--facility", str(facility), "--prometheus", url)
    assert code == 3
    assert out == [out[0]] and out[0].startswith(f"{facility}: ok (")
    assert err == [
        f"check-config --prometheus: cannot check the signals: cannot reach {url} "
        "(1 attempt): Connection refused"
    ]


def test_a_prometheus_that_never_answers_is_given_up_at_the_deadline(capsys, tmp_path):
    facility = write(tmp_path, "facility.yaml", FACILITY)
    with socket.socket() as silent:  # the kernel accepts connections; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        code, _out, err = run(
            capsys,
            *("--facility", str(facility), "--prometheus", url, "--prometheus-timeout", "0.5"),
        )
        took = time.monotonic() - started
    assert code == 3
    assert err == [
        f"check-config --prometheus: cannot check the signals: no answer from {url} within "
        "0.5s, 1 attempt"
    ]
    assert took < 10, f"the query's deadline is 1.5 s; it took {took:.1f} s"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--prometheus"],
            "check-config --prometheus: --prometheus without a URL takes the Prometheus of "
            "one --decider-config; give exactly one (got 0), or give the URL",
        ),
        (
            ["--prometheus", "ftp://prometheus:9090"],
            "check-config --prometheus: --prometheus: 'ftp://prometheus:9090' is not an "
            "http:// or https:// URL",
        ),
        (
            ["--prometheus", "http://127.0.0.1:9", "--prometheus-user", "ops"],
            "check-config --prometheus: --prometheus-user and --prometheus-password-file go "
            "together (basic auth)",
        ),
        (
            ["--prometheus", "http://127.0.0.1:9", "--prometheus-credentials-file", "absent"],
            "check-config --prometheus: absent: cannot be read",
        ),
    ],
)
def test_unusable_options_exit_2_before_any_query(capsys, tmp_path, argv, message):
    facility = write(tmp_path, "facility.yaml", FACILITY)
    code, out, err = run(capsys, "--facility", str(facility), *argv)
    assert (code, out, err) == (2, [], [message])


def test_no_facility_file_to_take_signals_from_exits_2(capsys):
    agent = Path(__file__).resolve().parent.parent / "examples" / "agent.yaml"
    code, out, err = run(capsys, "--agent", str(agent), "--prometheus", "http://127.0.0.1:9")
    assert code == 2
    assert out[0].startswith(f"{agent}: ok (")
    assert err == [
        "check-config --prometheus: no facility file to take signals from: give --facility "
        "facility.yaml or --decider-config decider.yaml"
    ]


def test_a_refused_facility_file_exits_2_and_no_signal_is_run(capsys, tmp_path):
    facility = write(tmp_path, "facility.yaml", "mode: enforced\n")
    url = f"http://127.0.0.1:{free_port()}"  # never asked: nothing to check
    code, out, err = run(capsys, "--facility", str(facility), "--prometheus", url)
    assert (code, out) == (2, [])
    assert len(err) == 1 and err[0].startswith(f"{facility}:1: mode: Input should be ")


PHASED = """\
mode: observe
domains:
  pdu/p1: {cap_watts: 13840, phases: {L1: {rating_watts: 8500}, L2: {rating_watts: 8500}, L3: {rating_watts: 8500}}}
  pdu/p2: {cap_watts: 13840}
signals:
  phase_power_watts: {query: 'sum by (pdu, phase) (pdu_phase_power_watts)', domain_label: pdu, phase_label: phase}
"""  # noqa: E501


@pytest.mark.servers
def test_a_signal_per_phase_maps_onto_the_declared_phases_of_each_pdu(
    prometheus_url, capsys, tmp_path
):
    facility = write(tmp_path, "facility.yaml", PHASED)
    code, out, err = run(capsys, "--facility", str(facility), "--prometheus", prometheus_url)
    assert code == 1, (out, err)
    assert err == [
        f"{facility}: signals.phase_power_watts: does not map onto the declared pdu "
        "phases: 4 series, 2 onto none of them; 1 declared pdu phase with no series",
        '  series {pdu="p1", phase="L4"}: phase \'L4\': not one of pdu/p1\'s phases (L1, L2, L3)',
        '  series {pdu="p2", phase="L1"}: pdu/p2 declares no phases',
        "  declared, no series: pdu/p1 L3",
        "  query: sum by (pdu, phase) (pdu_phase_power_watts)",
    ]
