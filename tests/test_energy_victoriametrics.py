"""rules/energy.yml in VictoriaMetrics and vmalert: the same figures as promtool's.

Each test of tests/rules/energy_test.yml (every method and GPU kind side by
side; a node changing method, energy and tokens over time) is imported into a
real VictoriaMetrics, vmalert replays
rules/energy.yml over it (`-replay.*`, one rule at a time over the whole range,
so every chained rule reads what the ones before it wrote), and every check of
that test must give what promtool expects, at the same time: queries and
expected values are read from that file, so the two never drift apart.
"""

from __future__ import annotations

import re
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
import yaml

from tests.promstack import binary, victoria_metrics

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "energy.yml"
PROMTOOL_TEST = ROOT / "tests" / "rules" / "energy_test.yml"
STEP_S = 30


def expand(values: str) -> list[float | None]:
    """promtool's series notation (`5x3`, `0+300x40`, `_x10`) as one value per step."""
    out: list[float | None] = []
    for term in values.split():
        match = re.fullmatch(r"(_|[-\d.e]+)(?:([+-][\d.e]+))?(?:x(\d+))?", term)
        assert match, f"unsupported promtool notation {term!r}"
        start, delta, times = match[1], float(match[2] or 0), int(match[3] or 0)
        for i in range(times + 1):
            out.append(None if start == "_" else float(start) + delta * i)
    return out


def dependency_steps(rules: list[dict]) -> list[list[dict]]:
    """The rules in steps: each after every earlier rule whose series it reads."""
    depth: dict[str, int] = {}
    steps: list[list[dict]] = []
    for rule in rules:
        reads = [
            depth[name]
            for name in depth
            if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", rule["expr"])
        ]
        level = max(reads, default=-1) + 1
        depth[rule["record"]] = max(depth.get(rule["record"], 0), level)
        if level == len(steps):
            steps.append([])
        steps[level].append(rule)
    return steps


def labels_key(text: str) -> tuple[str, frozenset[tuple[str, str]]]:
    name, _, rest = text.partition("{")
    pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest)
    return name, frozenset((k, v) for k, v in pairs if v != "")


SCENARIOS = yaml.safe_load(PROMTOOL_TEST.read_text())["tests"]


def seconds(duration: str) -> int:
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert match and duration, duration
    return int(match[1] or 0) * 60 + int(match[2] or 0)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[test["name"] for test in SCENARIOS])
def test_victoria_metrics_and_vmalert_give_promtools_figures(scenario: dict, tmp_path: Path):
    start = (int(time.time()) - 3600) // STEP_S * STEP_S
    lines = []
    for series in scenario["input_series"]:
        for step, value in enumerate(expand(series["values"])):
            if value is not None:
                lines.append(f"{series['series']} {value!r} {(start + step * STEP_S) * 1000}")
    checks = scenario["promql_expr_test"]
    at = start + max(seconds(check["eval_time"]) for check in checks)

    with victoria_metrics(tmp_path / "vm", scrape_targets={}) as vm:
        requests.post(
            f"{vm.url}/api/v1/import/prometheus", data="\n".join(lines), timeout=30
        ).raise_for_status()
        requests.get(f"{vm.url}/internal/force_flush", timeout=30).raise_for_status()

        def iso(seconds: int) -> str:
            return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        # Rules in dependency order, VictoriaMetrics flushed between steps, so each rule
        # reads every sample the rules it reads wrote (vmalert's -replay.rulesDelay is
        # a guess at how long storage takes; a flush is a fact).
        group = yaml.safe_load(RULES.read_text())["groups"][0]
        for index, rules in enumerate(dependency_steps(group["rules"])):
            single = tmp_path / f"step-{index:02d}.yml"
            single.write_text(yaml.safe_dump({"groups": [{**group, "rules": rules}]}))
            replay = subprocess.run(
                [
                    binary("vmalert"),
                    f"-rule={single}",
                    f"-datasource.url={vm.url}",
                    f"-remoteWrite.url={vm.url}",
                    f"-replay.timeFrom={iso(start)}",
                    f"-replay.timeTo={iso(at)}",
                    "-replay.rulesDelay=0s",  # a step's rules do not read each other
                    f"-datasource.queryStep={STEP_S}s",  # replay every 30 s, not every 5 min
                    "-remoteWrite.flushInterval=100ms",
                    "-replay.disableProgressBar",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
            requests.get(f"{vm.url}/internal/force_flush", timeout=30).raise_for_status()

        for check in checks:
            answer = requests.get(
                f"{vm.url}/api/v1/query",
                params={
                    "query": check["expr"],
                    "time": start + seconds(check["eval_time"]),
                    "step": f"{STEP_S}s",
                },
                timeout=30,
            ).json()
            assert answer["status"] == "success", answer
            # Series are told apart by their labels; the name is the query's (MetricsQL
            # keeps it through round(), PromQL drops it).
            got = {
                frozenset((k, v) for k, v in result["metric"].items() if k != "__name__"): float(
                    result["value"][1]
                )
                for result in answer["data"]["result"]
            }
            expected = {
                labels_key(sample["labels"])[1]: float(sample["value"])
                for sample in check["exp_samples"]
            }
            assert got == expected, f"{check['expr']} at {check['eval_time']}"
