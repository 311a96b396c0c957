"""The `hot` part's PromQL (decider/refresher.py QUERIES["hot"]) on real engines.

How long a domain has been hot is Prometheus' own record of `llmgw_domain_condition`, read
by a subquery at the rules' 30 s step. The same history is given to promtool (Prometheus'
engine, `promql_expr_test`) and to VictoriaMetrics (imported with timestamps), and both must
say, to within one step:

- rack r1, not hot for 5 minutes and hot since: hot for 14.5 minutes at 20 minutes;
- rack r2, hot all along: hot for the whole 15-minute lookback (it saturates there);
- rack r3, hot for 10 minutes and then not: hot for no time at all now.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from decider.refresher import queries
from tests.promstack import victoria_metrics

STEP_S = 30
EVAL_S = 1200  # 20 minutes into the history
#: domain → its hot series' value at each 30 s step from 0 to EVAL_S (41 samples).
HISTORY = {
    "r1": [0] * 11 + [1] * 30,  # 0 at 0..300 s, hot from 330 s
    "r2": [1] * 41,
    "r3": [1] * 21 + [0] * 20,  # hot until 600 s, then not
}
#: Seconds hot at EVAL_S, each to within one step.
EXPECTED = {"r1": 870.0, "r2": 900.0, "r3": 0.0}
QUERY = queries(90, hot_lookback_seconds=900)["hot"]


def series(domain: str) -> str:
    return f'llmgw_domain_condition{{kind="rack",domain="{domain}",condition="hot"}}'


def assert_hot_seconds(found: dict[str, float]) -> None:
    assert found.keys() == EXPECTED.keys(), found
    for domain, seconds in EXPECTED.items():
        assert abs(found[domain] - seconds) <= STEP_S, (domain, found[domain], seconds)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_engine_reads_how_long_each_domain_is_hot(tmp_path: Path):
    # promtool compares exact values: ask it whether each figure is within one step.
    inputs = [
        {"series": series(domain), "values": " ".join(str(v) for v in values)}
        for domain, values in HISTORY.items()
    ]
    tests = []
    for domain, seconds in EXPECTED.items():
        within = (
            f"((({QUERY}) >= bool {seconds - STEP_S}) * (({QUERY}) <= bool {seconds + STEP_S}))"
        )
        tests.append(
            {
                "expr": f"{within} and on (domain) {series(domain)}",
                "eval_time": f"{EVAL_S}s",
                "exp_samples": [
                    {"labels": f'{{kind="rack",domain="{domain}",condition="hot"}}', "value": 1}
                ],
            }
        )
    test_file = tmp_path / "hot_query_test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "evaluation_interval": f"{STEP_S}s",
                "tests": [
                    {"interval": f"{STEP_S}s", "input_series": inputs, "promql_expr_test": tests}
                ],
            }
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


def test_victoria_metrics_reads_how_long_each_domain_is_hot(tmp_path: Path):
    start = (int(time.time()) // 3600 - 2) * 3600  # two hours back, on the hour
    lines = [
        f"{series(domain)} {value} {(start + index * STEP_S) * 1000}"
        for domain, values in HISTORY.items()
        for index, value in enumerate(values)
    ]
    with victoria_metrics(tmp_path / "vm", scrape_targets={}) as server:
        imported = requests.post(
            f"{server.url}/api/v1/import/prometheus", data="\n".join(lines) + "\n", timeout=10
        )
        assert imported.status_code == 204, imported.text
        found: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while len(found) < len(EXPECTED) and time.monotonic() < deadline:
            requests.get(f"{server.url}/internal/force_flush", timeout=10)
            answer = requests.get(
                f"{server.url}/api/v1/query",
                params={"query": QUERY, "time": start + EVAL_S},
                timeout=10,
            ).json()
            assert answer["status"] == "success", answer
            found = {
                item["metric"]["domain"]: float(item["value"][1])
                for item in answer["data"]["result"]
            }
            time.sleep(0.2)
    assert_hot_seconds(found)
