"""Refusals that name the reading and how long (issue 17 part 3): the evidence part's PromQL
(decider/refresher.py QUERIES["evidence"]) on Prometheus' engine, its parsing, the words
(decider/placement/evidence.py), and a refusal through a real decider."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import MappingProxyType

import pytest
import requests
import yaml

from decider import placement
from decider.config import Staleness
from decider.domains_json import domain_json
from decider.facility import DomainRef, Facility
from decider.models import Replica
from decider.placement.evidence import describe, duration
from decider.prometheus_parse import Dropped, Sample, parse_part
from decider.refresher import queries
from decider.shedding import planner
from decider.snapshot import PARTS, Evidence, Part, Snapshot
from decider.state import State
from decider.store import Store
from llmgw_facility.cli import main as cli_main
from tests.decider_harness import Decider, FakePrometheus, Readings, poll
from tests.promstack import victoria_metrics

RACK = DomainRef("rack", "r12-07")
REPLICA = Replica(model="m", profile="p", gpus=1, power_watts=10)
ROW = DomainRef("row", "12")


# --- the words --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "condition", "evidence", "seconds", "words"),
    [
        (
            RACK,
            "hot",
            Evidence(inlet_celsius=33.1, inlet_hot_celsius=32, inlet_warm_celsius=27),
            360,
            "rack r12-07 hot: inlet 33.1 °C over its 32 °C hot threshold for 6 min",
        ),
        (ROW, "hot", Evidence(cooling_alarm=1), 180, "row 12 hot: cooling unit in alarm for 3 min"),
        (
            DomainRef("rack", "r12-08"),
            "warm",
            Evidence(gpus=32, gpus_thermally_throttled=3, inlet_celsius=25, inlet_warm_celsius=27),
            40,
            "rack r12-08 warm: 3 of 32 GPUs thermally throttled for 40 s",
        ),
        (
            RACK,
            "hot",
            Evidence(gpus=32, gpus_thermally_throttled=9, throttled_hot_ratio=0.25),
            7500,
            "rack r12-07 hot: 9 of 32 GPUs thermally throttled (hot from 25%) for 2 h 5 min",
        ),
        (
            ROW,
            "hot",
            Evidence(racks_hot_ratio=0.75, racks_hot_share=0.5),
            None,
            "row 12 hot: 75% of its racks hot (hot above 50%)",
        ),
        (
            ROW,
            "warm",
            Evidence(racks_warm_ratio=0.5, racks_warm_share=0),
            600,
            "row 12 warm: 50% of its racks warm or hot (warm above 0%) for 10 min",
        ),
        # Still hot, its inlet back under the hot mark (it leaves after 5 clear minutes).
        (
            RACK,
            "hot",
            Evidence(inlet_celsius=30, inlet_hot_celsius=32, inlet_warm_celsius=27),
            900,
            "rack r12-07 hot: inlet 30 °C over its 27 °C warm threshold for 15 min",
        ),
        (
            RACK,
            "hot",
            Evidence(inlet_celsius=26),
            60,
            "rack r12-07 hot: inlet 26 °C, cooling down for 1 min",
        ),
        # Missing data: nothing, and the caller keeps its plain words.
        (RACK, "hot", None, 120, None),
        (RACK, "hot", Evidence(), None, None),
        (RACK, "hot", None, None, None),
        (RACK, "ok", Evidence(inlet_celsius=40, inlet_hot_celsius=32), 60, None),
    ],
)
def test_the_words_name_each_figure_and_how_long(ref, condition, evidence, seconds, words):
    assert describe(ref, condition, evidence, seconds) == words


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0, 59.4, 60, 359, 3600, 3660, 86400)] == [
        "0 s", "59 s", "1 min", "5 min", "1 h", "1 h 1 min", "24 h",
    ]  # fmt: skip


# --- parsing ----------------------------------------------------------------------------------


def test_one_bad_evidence_series_is_left_out_alone():
    dropped = Dropped()
    samples = [
        Sample({"kind": "rack", "domain": "r12-07", "figure": "inlet_celsius"}, 33.1),
        Sample({"kind": "rack", "domain": "r12-07", "figure": "inlet_hot_celsius"}, 32.0),
        Sample({"kind": "rack", "domain": "r12-07", "figure": "warm_seconds"}, 360.0),
        Sample({"kind": "rack", "domain": "r12-07", "figure": "gpus"}, -3.0),
        Sample({"kind": "rack", "domain": "r12-07", "figure": "colour"}, 1.0),
        Sample({"kind": "shelf", "domain": "x", "figure": "gpus"}, 1.0),
        Sample({"kind": "row", "domain": "12", "figure": "inlet_celsius"}, -2.0),  # a cold row
    ]
    assert parse_part("evidence", samples, dropped) == {
        RACK: Evidence(inlet_celsius=33.1, inlet_hot_celsius=32.0, warm_seconds=360.0),
        ROW: Evidence(inlet_celsius=-2.0),
    }
    note = dropped.message()
    assert note is not None and note.startswith("left out 3 bad series")
    assert "-3 is negative" in note and "'colour' is not an evidence figure" in note


# --- the query on Prometheus' engine ----------------------------------------------------------

STEP_S = 30
EVAL_S = 600
SAMPLES = EVAL_S // STEP_S + 1  # 0 s to EVAL_S
QUERY = queries(90, hot_lookback_seconds=900)["evidence"]
THRESHOLD = "llmgw:domain_threshold:value"


def state_set(kind: str, name: str, states: list[tuple[str, int]]) -> dict[str, list[float]]:
    """A domain's four condition series, `states` being (condition, samples) in order."""
    return {
        f'llmgw_domain_condition{{kind="{kind}",domain="{name}",condition="{state}"}}': [
            1.0 if held == state else 0.0 for held, count in states for _ in range(count)
        ]
        for state in ("ok", "warm", "hot", "unknown")
    }


#: Rack r12-07 ok, then warm from 90 s, hot from 210 s: its inlet, thresholds and GPUs; row
#: 12 hot throughout on a cooling alarm and its racks' share (its hottest node's inlet is not
#: its evidence); rack r1 ok: nothing of it. Every series one value a step from 0 s.
HISTORY: dict[str, list[float]] = {
    **state_set("rack", "r12-07", [("ok", 3), ("warm", 4), ("hot", SAMPLES - 7)]),
    **state_set("row", "12", [("hot", SAMPLES)]),
    **state_set("rack", "r1", [("ok", SAMPLES)]),
    **{
        series: [value] * SAMPLES
        for series, value in {
            'llmgw_domain_inlet_temperature_celsius{kind="rack",domain="r12-07"}': 33.1,
            'llmgw_domain_inlet_temperature_celsius{kind="rack",domain="r1"}': 22,
            'llmgw_domain_inlet_temperature_celsius{kind="row",domain="12"}': 33.1,
            f'{THRESHOLD}{{kind="rack",domain="r12-07",threshold="inlet_hot_celsius"}}': 32,
            f'{THRESHOLD}{{kind="rack",domain="r1",threshold="inlet_hot_celsius"}}': 32,
            # Not a threshold of the evidence: left out.
            f'{THRESHOLD}{{kind="rack",domain="r12-07",threshold="gpu_slowdown_margin_celsius"}}': 5,  # noqa: E501
            'llmgw:domain_gpus:count{kind="rack",domain="r12-07"}': 32,
            'llmgw:domain_gpus_thermally_throttled:count{kind="rack",domain="r12-07"}': 3,
            'llmgw:domain_gpus:count{kind="row",domain="12"}': 64,
            'llmgw:domain_cooling_alarm{kind="row",domain="12",unit="crac-3"}': 1,
            'llmgw:domain_racks_hot:ratio{kind="row",domain="12"}': 0.5,
        }.items()
    },
}  # fmt: skip
EXPECTED = {
    ("rack", "r12-07", "inlet_celsius"): 33.1,
    ("rack", "r12-07", "inlet_hot_celsius"): 32,
    ("rack", "r12-07", "gpus"): 32,
    ("rack", "r12-07", "gpus_thermally_throttled"): 3,
    # The last evaluation not warm or hot at 60 s: 540 s at 600 s.
    ("rack", "r12-07", "warm_seconds"): 540,
    ("row", "12", "cooling_alarm"): 1,
    ("row", "12", "racks_hot_ratio"): 0.5,
    ("row", "12", "warm_seconds"): 600,  # its first sample: as far back as it goes
}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_reads_each_warm_or_hot_domains_evidence(tmp_path: Path):
    inputs = [
        {"series": series, "values": " ".join(f"{value:g}" for value in values)}
        for series, values in HISTORY.items()
    ]
    samples = [
        {"labels": f'{{kind="{kind}",domain="{name}",figure="{figure}"}}', "value": value}
        for (kind, name, figure), value in EXPECTED.items()
    ]
    test = {"expr": QUERY, "eval_time": f"{EVAL_S}s", "exp_samples": samples}
    test_file = tmp_path / "evidence_query_test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "evaluation_interval": f"{STEP_S}s",
                "tests": [
                    {"interval": f"{STEP_S}s", "input_series": inputs, "promql_expr_test": [test]}
                ],
            },
            width=10_000,
        )
    )
    result = subprocess.run(
        ["promtool", "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_victoria_metrics_reads_each_warm_or_hot_domains_evidence(tmp_path: Path):
    """The same history imported into VictoriaMetrics: the same figures, how long to within
    one step (its subquery steps are aligned its own way)."""
    start = (int(time.time()) // 3600 - 2) * 3600  # two hours back, on the hour
    lines = [
        f"{series} {value:g} {(start + index * STEP_S) * 1000}"
        for series, values in HISTORY.items()
        for index, value in enumerate(values)
    ]
    found: dict[tuple[str, str, str], float] = {}
    with victoria_metrics(tmp_path / "vm", scrape_targets={}) as server:
        imported = requests.post(
            f"{server.url}/api/v1/import/prometheus", data="\n".join(lines) + "\n", timeout=10
        )
        assert imported.status_code == 204, imported.text
        deadline = time.monotonic() + 30
        while found.keys() != EXPECTED.keys() and time.monotonic() < deadline:
            requests.get(f"{server.url}/internal/force_flush", timeout=10)
            answer = requests.get(
                f"{server.url}/api/v1/query",
                params={"query": QUERY, "time": start + EVAL_S},
                timeout=10,
            ).json()
            assert answer["status"] == "success", answer
            found = {
                (item["metric"]["kind"], item["metric"]["domain"], item["metric"]["figure"]): float(
                    item["value"][1]
                )
                for item in answer["data"]["result"]
            }
            time.sleep(0.2)
    assert found.keys() == EXPECTED.keys(), found
    for key, value in EXPECTED.items():
        tolerance = STEP_S if key[2] == "warm_seconds" else 1e-9
        assert abs(found[key] - value) <= tolerance, (key, found[key], value)


# --- the domain table and the shedding plan ---------------------------------------------------

T0 = 1_700_000_000.0


def state_with(
    tmp_path: Path, evidence: dict, *, shedding_on: bool = False, row: str = "hot"
) -> State:
    facility: dict = {"mode": "enforce"}
    if shedding_on:
        facility["shedding"] = {"enabled": True}
    state = State(
        Facility.model_validate(facility),
        Store(tmp_path / "decider.db"),
        300,
        Staleness(readings=120, inventory=3600),
        clock=lambda: T0,
    )
    warm_rack = DomainRef("rack", "r12-08")
    state.set_snapshot(
        Snapshot(
            membership=MappingProxyType({"n1": (RACK, ROW), "n2": (warm_rack, ROW)}),
            conditions=MappingProxyType({RACK: "hot", ROW: row, warm_rack: "warm"}),
            hot_seconds=MappingProxyType({RACK: 360.0, ROW: 240.0}),
            evidence=MappingProxyType(evidence),
            parts={part: Part(T0) for part in PARTS},
            prometheus_up=True,
        )
    )
    return state


EVIDENCE = {
    RACK: Evidence(inlet_celsius=33.1, inlet_hot_celsius=32, inlet_warm_celsius=27),
    ROW: Evidence(cooling_alarm=1),
    DomainRef("rack", "r12-08"): Evidence(gpus=32, gpus_thermally_throttled=3, warm_seconds=90),
}


def test_the_domain_table_names_each_warm_or_hot_domains_evidence(tmp_path):
    view = state_with(tmp_path, EVIDENCE).view()
    assert domain_json(view, RACK)["evidence"] == (
        "rack r12-07 hot: inlet 33.1 °C over its 32 °C hot threshold for 6 min"
    )
    assert domain_json(view, ROW)["evidence"] == "row 12 hot: cooling unit in alarm for 4 min"
    assert domain_json(view, DomainRef("rack", "r12-08"))["evidence"] == (
        "rack r12-08 warm: 3 of 32 GPUs thermally throttled for 1 min"
    )


def test_without_evidence_the_words_are_todays(tmp_path):
    state = state_with(tmp_path, {}, shedding_on=True)
    assert domain_json(state.view(), RACK)["evidence"] is None
    verdict = placement.decide(state.view(), REPLICA, ["n1"]).as_json()["nodes"][0]
    assert verdict["reasons"] == ["rack r12-07 hot", "row 12 hot"]
    plan = planner.plan(state.view(), T0, {})
    assert [entry["reason"] for entry in plan.entries] == [
        "rack r12-07 hot for 6m, shed after 10m",
        "row 12 hot for 4m, shed after 10m",
    ]


def test_the_shedding_plan_names_what_holds_each_domain_hot(tmp_path):
    plan = planner.plan(state_with(tmp_path, EVIDENCE, shedding_on=True).view(), T0, {})
    assert [entry["reason"] for entry in plan.entries] == [
        "rack r12-07 hot: inlet 33.1 °C over its 32 °C hot threshold for 6 min, shed after 10m",
        "row 12 hot: cooling unit in alarm for 4 min, shed after 10m",
    ]
    assert plan.entries[1]["evidence"] == "row 12 hot: cooling unit in alarm for 4 min"


def test_a_refusal_names_what_holds_each_domain_hot_and_how_long(tmp_path):
    verdict = placement.decide(state_with(tmp_path, EVIDENCE).view(), REPLICA, ["n1"])
    assert verdict.as_json()["nodes"][0]["reasons"] == [
        "rack r12-07 hot: inlet 33.1 °C over its 32 °C hot threshold for 6 min",
        "row 12 hot: cooling unit in alarm for 4 min",
    ]


def test_a_warm_node_says_why_it_is_placed_after_the_ok_ones(tmp_path):
    evidence = {**EVIDENCE, ROW: Evidence(racks_warm_ratio=0.5, racks_warm_share=0)}
    state = state_with(tmp_path, evidence, row="warm")
    [node] = placement.decide(state.view(), REPLICA, ["n2"]).as_json()["nodes"]
    assert node["allowed"] and node["scores"]["condition"] == 1
    assert node["condition_evidence"] == [
        "rack r12-08 warm: 3 of 32 GPUs thermally throttled for 1 min",
        "row 12 warm: 50% of its racks warm or hot (warm above 0%)",
    ]
    state.override(DomainRef("rack", "r12-08"), "sensor fault", 600, "ops")
    [node] = placement.decide(state.view(), REPLICA, ["n2"]).as_json()["nodes"]
    assert node["condition_evidence"] == [
        "row 12 warm: 50% of its racks warm or hot (warm above 0%)"
    ]


# --- through a real decider: its placements and the CLI's explain-placement --------------------


def test_a_real_decider_names_the_evidence_it_reads_from_prometheus(tmp_path, capsys):
    fake = FakePrometheus(
        Readings(
            membership={"n1": ["rack/r12-07", "row/12"], "n2": ["rack/r12-08", "row/12"]},
            inventory=["rack/r12-07", "rack/r12-08", "row/12"],
            conditions={"rack/r12-07": "hot", "rack/r12-08": "warm", "row/12": "ok"},
            ages={"rack/r12-07": 14.0},
            hot={"rack/r12-07": 360.0},
            gpus={"n1": 8, "n2": 8},
            evidence={
                "rack/r12-07": {"inlet_celsius": 33.1, "inlet_hot_celsius": 32.0},
                "rack/r12-08": {"gpus": 32, "gpus_thermally_throttled": 3, "warm_seconds": 90},
            },
        )
    )
    decider = Decider(tmp_path / "decider", fake.url, {"mode": "enforce"})
    words = "rack r12-07 hot: inlet 33.1 °C over its 32 °C hot threshold for 6 min"
    try:
        decider.start()
        body = {"replica": REPLICA.model_dump(), "candidates": ["n1", "n2"]}

        def refused() -> list[str] | None:
            answer = decider.post("/v1/placements", body).json()
            return answer["nodes"][0]["reasons"] or None

        assert poll(refused, "n1 refused") == [f"{words} (reading 14s old)"]
        n2 = decider.post("/v1/placements", body).json()["nodes"][1]
        assert n2["allowed"] and n2["condition"] == "warm"
        assert n2["condition_evidence"] == [
            "rack r12-08 warm: 3 of 32 GPUs thermally throttled for 1 min"
        ]
        warm = decider.get("/v1/domains/rack/r12-08").json()
        assert warm["evidence"] == "rack r12-08 warm: 3 of 32 GPUs thermally throttled for 1 min"
        assert "rack r12-08 warm: 3 of 32 GPUs" in decider.get("/").text

        replica = ["--model", "m", "--profile", "p", "--gpus", "1", "--power-watts", "10"]
        code = cli_main(["explain-placement", "--decider", decider.url, *replica, "n1", "n2"])
        assert code == 0
        explained = capsys.readouterr().out.splitlines()
        assert f"    - {words} (reading 14s old)" in explained
        assert (
            "    - placed after ok nodes: rack r12-08 warm: 3 of 32 GPUs thermally throttled "
            "for 1 min" in explained
        )

        # Prometheus has no evidence for it any more: today's words.
        fake.readings.evidence = {}

        def plain() -> bool:
            answer = decider.post("/v1/placements", body).json()
            return answer["nodes"][0]["reasons"] == ["rack r12-07 hot (reading 14s old)"]

        poll(plain, "today's words once the evidence is gone")
    finally:
        decider.close()
        fake.close()
