"""`llmgw-facility demo` (llmgw_sim/demo, docs/simulation.md): the rules scaled in time with
their logic unchanged, the demo's files, and the whole story run once against a real
Prometheus, Alertmanager and decider."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from decider import facility as facility_file
from decider.promql import tokens
from llmgw_sim import scenario as scenario_file
from llmgw_sim.demo import main as demo
from llmgw_sim.demo.scale import duration_seconds, scale_duration, scale_expr, scale_rules
from tests.demo_helpers import DEMO_TIMEOUT_S, REPO, _finish, _urls

# --- scaling durations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "factor", "scaled"),
    [
        ("30s", 30, "1s"),
        ("2m15s", 30, "4500ms"),
        ("5m15s", 30, "10500ms"),
        ("15m15s", 30, "30500ms"),
        ("1h", 30, "2m"),
        ("2m", 1, "2m"),
        ("0s", 30, "0s"),
        ("1d", 24, "1h"),
        ("500ms", 5, "100ms"),
    ],
)
def test_a_duration_is_divided(text, factor, scaled):
    assert scale_duration(text, factor) == scaled
    assert duration_seconds(scaled) == pytest.approx(duration_seconds(text) / factor, abs=5e-4)


@pytest.mark.parametrize("text", ["", "5", "5x", "m5", "1m 5s", "-1m"])
def test_a_duration_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="is not a Prometheus duration"):
        duration_seconds(text)


@pytest.mark.parametrize(
    ("expr", "scaled"),
    [
        # range windows, offsets and subqueries
        (
            "min_over_time(x[2m15s]) >= 27 and on (kind) present_over_time(x[1m] offset 2m)",
            "min_over_time(x[4500ms]) >= 27 and on (kind) present_over_time(x[2s] offset 4s)",
        ),
        ("max_over_time(rate(x[5m])[30m:1m])", "max_over_time(rate(x[10s])[1m:2s])"),
        # seconds of time and age
        ("last_over_time(y[15m15s]) > time() - 3600", "last_over_time(y[30500ms]) > time() - 120"),
        ("(time() - timestamp(level) < 60)", "(time() - timestamp(level) < 2)"),
        ("llmgw_domain_reading_age_seconds <= 300", "llmgw_domain_reading_age_seconds <= 10"),
        ('snapshot_age_seconds{a="b"} > bool 300', 'snapshot_age_seconds{a="b"} > bool 10'),
        ("time() - x_timestamp_seconds > 90", "time() - x_timestamp_seconds > 3"),
        # numbers that are not seconds of age: thresholds, counts, timestamps, durations
        ("llmgw_exporter_source_up == 0", "llmgw_exporter_source_up == 0"),
        ("x_duration_seconds > 300", "x_duration_seconds > 300"),
        ("x_last_success_timestamp_seconds > 300", "x_last_success_timestamp_seconds > 300"),
        ("clamp(x, 2, 2) * 0 + 27", "clamp(x, 2, 2) * 0 + 27"),
        ("topk by (node) (1, x)", "topk by (node) (1, x)"),
        # strings and comments are text
        (
            'label_replace(x, "a", "5m", "b", "") # over 5m',
            'label_replace(x, "a", "5m", "b", "") # over 5m',
        ),
    ],
)
def test_an_expression_keeps_its_logic_and_runs_faster(expr, scaled):
    assert scale_expr(expr, 30) == scaled


def _shape(expr: str) -> list[tuple[str, str]]:
    """The expression's tokens, durations and numbers replaced by their kind."""
    return [
        (t.kind, t.kind if t.kind in ("duration", "number") else t.text)
        for t in tokens(expr)
        if t.kind not in ("space", "comment")
    ]


def test_the_scaled_rules_are_the_committed_rules_with_shorter_durations(tmp_path):
    facility = facility_file.load(demo.FACILITY)
    written = demo.write_scaled_rules(tmp_path, 30, facility)
    promtool = shutil.which("promtool")
    assert promtool is not None
    lint = subprocess.run(
        [promtool, "check", "rules", "--lint-fatal", *map(str, written)],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    sources = demo.rule_sources()
    assert [p.name for p in written] == [f"{p.parent.name}-{p.name}" for p in sources] + [
        "site-llmgw-site.yml"
    ]
    durations = 0
    for source, copy in zip(sources, written, strict=False):
        original = yaml.safe_load(source.read_text())
        scaled = yaml.safe_load(copy.read_text())
        assert [g["name"] for g in scaled["groups"]] == [g["name"] for g in original["groups"]]
        for group, fast in zip(original["groups"], scaled["groups"], strict=True):
            if "interval" in group:
                assert (
                    duration_seconds(fast["interval"]) == duration_seconds(group["interval"]) / 30
                )
            for rule, quick in zip(group["rules"], fast["rules"], strict=True):
                assert {k: v for k, v in rule.items() if k not in ("expr", "for")} == {
                    k: v for k, v in quick.items() if k not in ("expr", "for")
                }
                if "for" in rule:
                    assert duration_seconds(quick["for"]) == duration_seconds(rule["for"]) / 30
                assert _shape(quick["expr"]) == _shape(rule["expr"])
                before = [t for t in tokens(rule["expr"]) if t.kind == "duration"]
                after = [t for t in tokens(quick["expr"]) if t.kind == "duration"]
                for old, new in zip(before, after, strict=True):
                    assert duration_seconds(new.text) == pytest.approx(
                        duration_seconds(old.text) / 30, abs=5e-4
                    )
                durations += len(before)
    assert durations > 50
    conditions = (tmp_path / "rules-conditions.yml").read_text()
    assert "[4500ms]" in conditions and "[2m15s]" not in conditions
    assert "interval: 1s" in conditions
    site = yaml.safe_load((tmp_path / "site-llmgw-site.yml").read_text())
    exprs = [r["expr"] for g in site["groups"] for r in g["rules"]]
    assert any("crac_alarm[10s]" in e for e in exprs)  # stale_after 5m, scaled


def test_scaling_by_one_changes_no_duration():
    text = (REPO / "rules" / "conditions.yml").read_text()
    scaled = yaml.safe_load(scale_rules(text, 1))
    original = yaml.safe_load(text)
    for group, same in zip(original["groups"], scaled["groups"], strict=True):
        for rule, twin in zip(group["rules"], same["rules"], strict=True):
            assert [
                duration_seconds(t.text) for t in tokens(twin["expr"]) if t.kind == "duration"
            ] == [duration_seconds(t.text) for t in tokens(rule["expr"]) if t.kind == "duration"]


# --- the demo's files ------------------------------------------------------------------------


def test_the_demo_facility_file_budgets_the_demo_site():
    scenario = scenario_file.load(demo.SCENARIO)
    facility = facility_file.load(demo.FACILITY)
    assert facility.mode == "enforce"
    assert facility.profiles[demo.PROFILE].gpus > 0
    racks = {place.rack: place.pdus for place in scenario.nodes}
    for rack, pdus in racks.items():
        domain = facility.domains[f"rack/{rack}"]
        assert {feed.pdu for feed in domain.feeds} == set(pdus), rack
    assert facility.signals.cooling_alarm is not None
    # the story: a cooling failure, and a profile that fills a rack before it overflows
    assert any(event.kind == "cooling_failure" for event in scenario.events)


def test_the_demo_says_which_debian_package_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no prometheus, promtool or alertmanager here
    assert demo.run(once=True) == demo.EXIT_SETUP
    err = capsys.readouterr().err
    assert "prometheus, prometheus-alertmanager, promtool not found" in err
    assert "sudo apt-get install prometheus prometheus-alertmanager" in err
    assert "make debian-packages" in err


# --- the story, for real ------------------------------------------------------------------


def _demo(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "llmgw_facility.cli", "demo", *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # on a timeout, its whole process group is killed
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _all_down(urls: dict[str, str]) -> None:
    for name, url in urls.items():
        with pytest.raises(requests.ConnectionError):
            requests.get(url, timeout=2)
        assert name


def test_the_demo_tells_its_story_once(tmp_path):
    log = tmp_path / "demo.log"
    started = time.monotonic()
    process = _demo(["--once"], log)
    code = _finish(process, log, DEMO_TIMEOUT_S)
    output = log.read_text()
    assert code == 0, output
    for step in (
        "== 1. The site comes up",
        "== 2. Replicas of llama-70b-tp4 placed on rack r12-01 until it is full",
        "replica llama-70b-1 -> gpu-r12-01-01",
        "the next replica is refused: 0/",
        "rack r12-01: ",
        "== 3. A cooling unit of row 12 fails",
        "row 12 went ok -> warm -> hot",
        # each kind from its own evidence: one hot row of two leaves its room and site ok
        "room hall-b ok, site sto1 ok: row 12's heat is not theirs",
        "== 4. Placements move elsewhere",
        "and the rest of row 12: row 12 hot",
        "== 5. The alert arrives at Alertmanager",
        "LlmgwDomainHot (critical): row 12 is hot",
        "== 6. The shedding plan",
        "the decider proposes; the scheduler's preemption would carry it out",
        "the story is told",
    ):
        assert step in output, f"{step!r} missing from:\n{output}"
    refusal = re.search(r"rack r12-01: ([\d.]+) of 17.7 kW (measured|reserved)", output)
    assert refusal, output
    moved = re.search(r"replica llama-70b-\d+ -> (\S+) \(rack (\S+), row (\S+)\)", output)
    assert moved and moved.group(3) != "12", output
    shed = re.search(
        r"rack/r12-01, hot for .*: move (llama-70b-\d+) .* (gpu-r12-01-\d+) -> (\S+) "
        r"\(rack (\S+), row (\S+)\)",
        output,
    )
    assert shed and shed.group(5) != "12", output  # off the filled rack, out of the hot row
    urls = _urls(output)
    assert set(urls) == {"simulator", "Alertmanager", "Prometheus", "decider"}
    _all_down(urls)
    assert time.monotonic() - started < DEMO_TIMEOUT_S


def test_ctrl_c_stops_the_demo_and_every_server(tmp_path):
    log = tmp_path / "demo.log"
    process = _demo([], log)
    deadline = time.monotonic() + 120
    while "== 1. The site comes up" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            _finish(process, log, 1)
            pytest.fail(f"the demo did not start its story:\n{log.read_text()}")
        time.sleep(0.1)
    urls = _urls(log.read_text())
    assert requests.get(urls["Prometheus"] + "/-/ready", timeout=5).status_code == 200
    process.send_signal(signal.SIGINT)
    assert _finish(process, log, 60) == demo.EXIT_INTERRUPTED, log.read_text()
    assert "stopped; every server is down" in log.read_text()
    _all_down(urls)
