"""Refusals that name the reading and how long (issue 17 part 3): the evidence part's PromQL
(decider/refresher.py QUERIES["evidence"]) on Prometheus' engine, its parsing, the words
(decider/placement/evidence.py), and a refusal through a real decider."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from decider.facility import DomainRef
from decider.placement.evidence import describe, duration
from decider.prometheus_parse import Dropped, Sample, parse_part
from decider.refresher import queries
from decider.snapshot import Evidence

RACK = DomainRef("rack", "r12-07")
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
        # Missing data: how long alone, or nothing (the caller's plain words).
        (RACK, "hot", None, 120, "rack r12-07 hot for 2 min"),
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
QUERY = queries(90, hot_lookback_seconds=900)["evidence"]
THRESHOLD = "llmgw:domain_threshold:value"


def steady(value: float) -> str:
    return f"{value}x{EVAL_S // STEP_S}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_reads_each_warm_or_hot_domains_evidence(tmp_path: Path):
    """Rack r12-07 hot since 4 minutes (warm before, from 2 minutes): its inlet, thresholds,
    GPUs and 8.5 minutes warm or hot; row 12 hot on a cooling alarm and its racks' share (its
    hottest node's inlet is not its evidence); rack r1 ok: nothing of it."""

    def condition(kind: str, name: str, states: list[tuple[str, int]]) -> list[dict[str, str]]:
        # states: (condition, samples) in order; the state set's four series.
        found = []
        for state in ("ok", "warm", "hot", "unknown"):
            values = " ".join(" ".join(["1" if s == state else "0"] * n) for s, n in states)
            found.append(
                {
                    "series": f'llmgw_domain_condition{{kind="{kind}",domain="{name}",'
                    f'condition="{state}"}}',
                    "values": values,
                }
            )
        return found

    def one(series: str, value: float) -> dict[str, str]:
        return {"series": series, "values": steady(value)}

    samples = EVAL_S // STEP_S + 1
    inputs = [
        *condition("rack", "r12-07", [("ok", 3), ("warm", 4), ("hot", samples - 7)]),
        *condition("row", "12", [("hot", samples)]),
        *condition("rack", "r1", [("ok", samples)]),
        one('llmgw_domain_inlet_temperature_celsius{kind="rack",domain="r12-07"}', 33.1),
        one('llmgw_domain_inlet_temperature_celsius{kind="rack",domain="r1"}', 22),
        one('llmgw_domain_inlet_temperature_celsius{kind="row",domain="12"}', 33.1),
        one(f'{THRESHOLD}{{kind="rack",domain="r12-07",threshold="inlet_hot_celsius"}}', 32),
        one(f'{THRESHOLD}{{kind="rack",domain="r1",threshold="inlet_hot_celsius"}}', 32),
        # Not a threshold of the evidence: left out.
        one(f'{THRESHOLD}{{kind="rack",domain="r12-07",threshold="gpu_slowdown_margin_celsius"}}', 5),  # noqa: E501
        one('llmgw:domain_gpus:count{kind="rack",domain="r12-07"}', 32),
        one('llmgw:domain_gpus_thermally_throttled:count{kind="rack",domain="r12-07"}', 3),
        one('llmgw:domain_gpus:count{kind="row",domain="12"}', 64),
        one('llmgw:domain_cooling_alarm{kind="row",domain="12",unit="crac-3"}', 1),
        one('llmgw:domain_racks_hot:ratio{kind="row",domain="12"}', 0.5),
    ]  # fmt: skip
    expected = {
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
    test_file = tmp_path / "evidence_query_test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "evaluation_interval": f"{STEP_S}s",
                "tests": [
                    {
                        "interval": f"{STEP_S}s",
                        "input_series": inputs,
                        "promql_expr_test": [
                            {
                                "expr": QUERY,
                                "eval_time": f"{EVAL_S}s",
                                "exp_samples": [
                                    {
                                        "labels": f'{{kind="{kind}",domain="{name}",'
                                        f'figure="{figure}"}}',
                                        "value": value,
                                    }
                                    for (kind, name, figure), value in expected.items()
                                ],
                            }
                        ],
                    }
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
