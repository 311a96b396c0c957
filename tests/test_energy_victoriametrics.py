"""rules/energy.yml in VictoriaMetrics and vmalert: the same figures as promtool's.

Each test of tests/rules/energy_test.yml (every method and GPU kind side by
side; a node changing method, energy and tokens over time) is imported into a
real VictoriaMetrics, vmalert replays
rules/energy.yml over it (`-replay.*`, one rule at a time over the whole range,
so every chained rule reads what the ones before it wrote), and every check of
that test must give what promtool expects, at the same time: queries and
expected values are read from that file, so the two never drift apart.

Replay hides vmalert's one-evaluation lag (each rule runs after the rules it reads,
over the whole range), so the energy sums are also run live in vmalert, where a rule
reads its group's output of the evaluation before.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
import yaml

from tests.promstack import binary, victoria_metrics, vmalert

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "energy.yml"
#: The sums per model (the domain layer), which read the units' figures of RULES.
MODEL_RULES = ROOT / "rules" / "energy_models.yml"
PROMTOOL_TEST = ROOT / "tests" / "rules" / "energy_test.yml"
STEP_S = 30
#: vmalert's remote write flush in the live test: rules read what it has flushed.
FLUSH_S = 20


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


def import_inputs(vm_url: str, scenario: dict, start: int) -> None:
    """The scenario's input series into VictoriaMetrics, step 0 at `start`."""
    lines = []
    for series in scenario["input_series"]:
        for step, value in enumerate(expand(series["values"])):
            if value is not None:
                lines.append(f"{series['series']} {value!r} {(start + step * STEP_S) * 1000}")
    requests.post(
        f"{vm_url}/api/v1/import/prometheus", data="\n".join(lines), timeout=30
    ).raise_for_status()
    requests.get(f"{vm_url}/internal/force_flush", timeout=30).raise_for_status()


def replay(vm_url: str, workdir: Path, start: int, end: int) -> None:
    """vmalert -replay of rules/energy.yml and rules/energy_models.yml from `start` to
    `end`: rules in dependency order, VictoriaMetrics flushed between steps, so each rule
    reads every sample the rules it reads wrote (vmalert's -replay.rulesDelay is a guess at
    how long storage takes; a flush is a fact). Every 30 s, as promtool evaluates them
    (the groups run every minute in production)."""

    def iso(seconds: int) -> str:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    group = yaml.safe_load(RULES.read_text())["groups"][0]
    models = yaml.safe_load(MODEL_RULES.read_text())["groups"][0]
    every_rule = group["rules"] + models["rules"]
    for index, rules in enumerate(dependency_steps(every_rule)):
        single = workdir / f"step-{index:02d}.yml"
        single.write_text(
            yaml.safe_dump({"groups": [{**group, "interval": f"{STEP_S}s", "rules": rules}]})
        )
        replayed = subprocess.run(
            [
                binary("vmalert"),
                f"-rule={single}",
                f"-datasource.url={vm_url}",
                f"-remoteWrite.url={vm_url}",
                f"-replay.timeFrom={iso(start)}",
                f"-replay.timeTo={iso(end)}",
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
        assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
        requests.get(f"{vm_url}/internal/force_flush", timeout=30).raise_for_status()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[test["name"] for test in SCENARIOS])
def test_victoria_metrics_and_vmalert_give_promtools_figures(scenario: dict, tmp_path: Path):
    start = (int(time.time()) - 3600) // STEP_S * STEP_S
    checks = scenario["promql_expr_test"]
    at = start + max(seconds(check["eval_time"]) for check in checks)

    with victoria_metrics(tmp_path / "vm", scrape_targets={}) as vm:
        import_inputs(vm.url, scenario, start)
        replay(vm.url, tmp_path, start, at)

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


#: The rules the unit's energy sum needs: the group's evaluation marker, then the sum.
ENERGY_RULES = ("llmgw:energy_group_evaluation:info", "llmgw:unit_energy_joules:sum5m")
MODEL_ENERGY = "llmgw:model_profile_energy_joules:sum5m"
UNIT = {"node": "n1", "unit": "u1", "model": "m1", "profile": "p1"}


def ramp_watts(at: int, base: int) -> float:
    """The unit's power at `at`: 100 W at `base`, 10 W more every 30 s."""
    return 100.0 + 10.0 * (at - base) / STEP_S


def test_live_vmalert_sums_the_ten_samples_prometheus_sums(tmp_path: Path) -> None:
    """vmalert evaluating, not replaying. There a rule sees what an earlier rule of its
    group wrote only once vmalert's remote write has flushed it: the evaluation before's
    output, not this evaluation's (a 20 s flush, the group's rules a few ms apart). A
    window that took this evaluation's power sample (`[4m45s]`) sums 10 samples in
    Prometheus and 9 here.

    The energy rules of rules/energy.yml, as written, run live in one group after a
    stand-in for `llmgw:unit_power_watts` (one unit's power, rising 10 W a step; its
    history, and the group's evaluation marker's, imported on the 30 s grid up to the
    last step before vmalert starts, so that no step has two samples). The unit's first
    figure must be 300 s x the mean stored power of the evaluations before its own in
    the window (x 30 s each: 10 of them), as Prometheus's would be. The sum per model
    (rules/energy_models.yml, a group of its own) reads the units' sums: its first
    figure is one of the unit's, as late as the hop between two groups makes it: one
    evaluation and the remote write's flush (FLUSH_S), so two evaluations here when the
    units' group runs later in the interval than the models' (CI saw both).
    """
    energy = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    rules = [rule for rule in energy if rule.get("record") in ENERGY_RULES]
    assert [rule["record"] for rule in rules] == list(ENERGY_RULES)
    models = yaml.safe_load(MODEL_RULES.read_text())["groups"][0]["rules"]
    by_model_rules = [rule for rule in models if rule.get("record") == MODEL_ENERGY]
    assert len(by_model_rules) == 1
    groups = [
        {
            "name": "energy-window",
            "interval": f"{STEP_S}s",
            "rules": [
                {"record": "llmgw:unit_power_watts", "expr": "max_over_time(ramp_watts[1m])"},
                *rules,
            ],
        },
        {"name": "energy-models", "interval": f"{STEP_S}s", "rules": by_model_rules},
    ]
    rule_file = tmp_path / "energy-window.yml"
    rule_file.write_text(yaml.safe_dump({"groups": groups}))
    labels = ",".join(f'{k}="{v}"' for k, v in UNIT.items())
    power = f"llmgw:unit_power_watts{{{labels}}}"
    marker = ENERGY_RULES[0]

    with victoria_metrics(tmp_path / "vm", scrape_targets={}) as vm:
        # vmalert evaluates at 30 s boundaries, the first at or after `now`.
        now = int(time.time()) // STEP_S * STEP_S
        base = now - 10 * 60
        history = [
            line
            for at in range(base, now, STEP_S)
            for line in (f"{power} {ramp_watts(at, base)} {at * 1000}", f"{marker} 1 {at * 1000}")
        ]
        inputs = [  # the stand-in's input, into the future: the live rule reads it
            f"ramp_watts{{{labels}}} {ramp_watts(at, base)} {at * 1000}"
            for at in range(base, now + 10 * STEP_S, STEP_S)
        ]
        requests.post(
            f"{vm.url}/api/v1/import/prometheus", data="\n".join(history + inputs), timeout=30
        ).raise_for_status()
        requests.get(f"{vm.url}/internal/force_flush", timeout=30).raise_for_status()
        with vmalert(
            tmp_path / "vmalert",
            rule_files=[rule_file],
            datasource=vm.url,
            notifiers=[],
            flush_interval=f"{FLUSH_S}s",
        ):
            deadline = time.monotonic() + 4 * STEP_S
            live: dict[int, dict[frozenset[tuple[str, str]], float]] = {}
            by_model: dict[int, dict[frozenset[tuple[str, str]], float]] = {}
            while not (live and by_model) and time.monotonic() < deadline:
                time.sleep(1)
                live = live_samples(vm.url, ENERGY_RULES[1], after=now - 1)
                by_model = live_samples(vm.url, MODEL_ENERGY, after=now - 1)
            assert live, f"vmalert wrote no {ENERGY_RULES[1]} within {4 * STEP_S} s"
            assert by_model, f"vmalert wrote no {MODEL_ENERGY} within {4 * STEP_S} s"
            first = min(live)
            # Every sample since the history began, however stamped: what the checks
            # below compare, and what a failure shows.
            units = live_samples(vm.url, ENERGY_RULES[1], after=base)
            by_model = live_samples(vm.url, MODEL_ENERGY, after=base)
            stored = live_samples(vm.url, power, after=base)

    def unit_sum(at: int) -> tuple[float | None, list[float]]:
        """What the unit's rule gives at `at`, as Prometheus would: 300 s x the mean stored
        power of the evaluations before it in its window (None: under 8 of them stored)."""
        before = [at - STEP_S * j for j in range(1, 11)]
        watts = [next(iter(stored[t].values())) for t in before if t in stored]
        # Steps between the history and vmalert's first evaluation (its start waits for
        # the group's phase) have no power and no marker: up to two, which Prometheus
        # would not have evaluated either.
        return (300 * sum(watts) / len(watts) if len(watts) >= 8 else None), watts

    def figures(samples: dict[int, dict[frozenset[tuple[str, str]], float]]) -> list:
        return [(at - now, list(values.values())) for at, values in sorted(samples.items())]

    seen = f"(s after {now}) units {figures(units)}, by model {figures(by_model)}"
    expected, watts = unit_sum(first)
    assert expected is not None, f"the power before {first} is not stored: {figures(stored)}"
    assert list(units[first].values()) == [pytest.approx(expected)], (
        f"at {first}: the evaluations before stored {watts}; {seen}"
    )
    # The sum per model reads the unit's sums: at its first evaluation, a figure of the unit
    # that vmalert had flushed by then: of the same evaluation, or of one up to an interval
    # and a flush before (docs/rules.md, "Lag"), whether read back from the unit's series or
    # worked out from the stored power as the unit's rule does.
    lag = math.ceil((STEP_S + FLUSH_S) / STEP_S)
    first_by_model = min(at for at in by_model if at >= now)
    then = [first_by_model - STEP_S * j for j in range(lag + 1)]
    allowed = [next(iter(units[at].values())) for at in then if at in units]
    allowed += [figure for figure, _ in map(unit_sum, then) if figure is not None]
    assert next(iter(by_model[first_by_model].values())) in [pytest.approx(v) for v in allowed], (
        f"at {first_by_model}: by model, not one of {allowed}; {seen}"
    )


def live_samples(
    vm_url: str, selector: str, after: int
) -> dict[int, dict[frozenset[tuple[str, str]], float]]:
    """Raw samples of `selector` stored later than `after`, by timestamp (s) then labels."""
    requests.get(f"{vm_url}/internal/force_flush", timeout=30).raise_for_status()
    answer = requests.get(
        f"{vm_url}/api/v1/export", params={"match[]": selector, "start": after + 1}, timeout=30
    )
    answer.raise_for_status()
    out: dict[int, dict[frozenset[tuple[str, str]], float]] = {}
    for line in answer.text.splitlines():
        series = json.loads(line)
        labels = frozenset((k, v) for k, v in series["metric"].items() if k != "__name__")
        for value, stamp in zip(series["values"], series["timestamps"], strict=True):
            out.setdefault(stamp // 1000, {})[labels] = float(value)
    return out
