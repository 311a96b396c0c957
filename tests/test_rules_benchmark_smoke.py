"""benchmarks/rules_eval.py at a tiny size (8 nodes, one evaluation), so the script never rots."""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from tests.benchmark_module import benchmark_module

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus and promtool are not installed (Debian package prometheus;"
    " `make debian-packages` installs it)",
)


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("rules_eval") as module:
        yield module


def test_topology_racks_rows_rooms(bench):
    fleet = bench.topology(1000)
    assert bench.domains(fleet) == {"site": 1, "room": 2, "row": 13, "rack": 125, "pdu": 250}
    assert len({node.name for node in fleet}) == 1000
    assert {node.slot for node in fleet if node.rack == "r01-01"} == set(range(8))
    assert set(bench.RACK_SCENARIOS.values()) <= {node.scenario for node in fleet}
    assert any(node.hwmon_down for node in fleet)
    # The small size has every scenario too.
    assert set(bench.RACK_SCENARIOS.values()) <= {n.scenario for n in bench.topology(100)}


def test_series_follow_the_metrics_contract(bench):
    from llmgw_common.metrics import METRICS

    node = bench.topology(100)[41]
    seen: dict[str, set[tuple[str, ...]]] = {}
    for name, labels, _ in bench.node_samples(node, 1.8e9, random.Random(1), 0.0):
        keys = tuple(sorted(part.split("=", 1)[0] for part in labels.split(",") if part))
        seen.setdefault(name, set()).add(keys)
    # The replicas' counter, with `node` and `unit` as rules/energy.yml reads it.
    assert seen.pop(bench.TOKENS) == {("unit",)}
    for name, label_sets in seen.items():
        assert label_sets == {tuple(sorted(METRICS[name].labels))}, name
    # Every family the exporter publishes, but for the Cray PMC's and the hwmon meter's
    # (the energy fleet's node power is a BMC's, over IPMI), and the replicas' token counter.
    not_simulated = {
        "llmgw_node_component_power_watts",
        "llmgw_node_energy_joules_total",
        # The exporter's own bookkeeping, which no rule selects (`failing` only joins the
        # gpu power while a source is down, when it is one series a node).
        "llmgw_exporter_source_failing",
        "llmgw_exporter_source_deadline_seconds",
        "llmgw_exporter_source_abandoned_polls_total",
        "llmgw_exporter_energy_resets_total",
        # The CPU model: no rule reads it (the decider queries it itself, for CPU profiles).
        "llmgw_node_cpu_info",
    }
    assert set(seen) == set(METRICS) - not_simulated
    body = bench.exposition(node, 1.8e9, random.Random(1), 0.0)
    series = [line for line in body.splitlines() if not line.startswith("#")]
    # 126, 8 + 8 per-GPU and 3 per-node GPU figures; the BMC (2), the units (4 units:
    # 4 x 4 + 8 GPU shares, 2 node totals) and their 2 sources (6).
    assert len(series) == 179
    plain = bench.exposition(bench.topology(100, energy=False)[41], 1.8e9, random.Random(1), 0.0)
    assert len([line for line in plain.splitlines() if not line.startswith("#")]) == 145
    if shutil.which("promtool"):
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=body.encode(), capture_output=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_backfill_plan_covers_the_long_windows(bench):
    rules = bench.load_rules(bench.RULE_FILES)
    recorded = {rule["record"] for rule in rules if "record" in rule}
    for warmup in (0, 390):
        plan = bench.plan_backfill(rules, warmup_s=warmup)
        for window in bench.windows(rules):
            if window.reach_s <= warmup:
                continue
            if window.metric in recorded:
                assert window.metric in plan.recorded | plan.live_only, window
            elif window.metric in bench.METRICS:  # one the generator serves
                assert window.metric in plan.raw, window
            if window.metric in plan.raw | plan.recorded:
                assert plan.history_s >= window.reach_s, window


def test_backfill_plan_on_made_up_rules(bench):
    rules = [
        {"record": "a:node:x", "expr": "max by (node) (llmgw_node_info)"},
        {"record": "a:domain:y", "expr": "sum(a:node:x) + count(a:domain:y[20m])"},
        {"alert": "Z", "expr": "last_over_time(a:node:x[1h]) or llmgw_gpu_info[30m] offset 5m"},
        {"alert": "W", "expr": "max_over_time(llmgw_gpu_power_watts[2m])"},
    ]
    plan = bench.plan_backfill(rules, warmup_s=390)
    assert plan.raw == {"llmgw_node_info", "llmgw_gpu_info"}
    assert plan.recorded == {"a:node:x"}
    assert plan.live_only == {"a:domain:y"}
    assert plan.history_s == 3600 + 300
    assert bench.seconds("15m15s") == 915
    assert bench.seconds("1h") == 3600
    with pytest.raises(ValueError):
        bench.seconds("5x")


def test_generator_serves_one_target_per_node(bench):
    generator = bench.Generator(8, down_since=0.0)
    with bench.serving(generator) as port:
        url = f"http://127.0.0.1:{port}/metrics/{generator.fleet[3].name}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert f'node="{generator.fleet[3].name}"' in body
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/nobody", timeout=10)
        missing.value.close()
        assert missing.value.code == 404
    assert generator.scrapes == 1


@needs_prometheus
def test_whole_run_at_eight_nodes(bench, tmp_path, capsys):
    output = tmp_path / "rules_eval.json"
    argv = ["--nodes", "8", "--warmup", "0", "--evaluations", "1", "--poll", "1"]
    assert bench.main([*argv, "--output", str(output)]) == 0

    result = json.loads(output.read_text())
    (size,) = result["sizes"]
    assert size["nodes"] == 8
    assert size["series"]["targets_up"] == 8
    assert size["series"]["scraped_per_round"] == 8 * 179
    energy = size["groups"]["llmgw-energy.rules"]["per_rule"]
    assert all(rule["health"] == ["ok"] for rule in energy)
    groups = size["groups"]
    assert {"llmgw-domain.rules", "llmgw-conditions.rules", "llmgw-domain.alerts"} <= set(groups)
    assert {bench.BASELINE_EMPTY, bench.BASELINE_TRIVIAL} <= set(groups)
    for name, figures in groups.items():
        assert figures["evaluations"] == 1, name
        assert figures["duration_ms"]["median"] >= 0
    domain_rules = groups["llmgw-domain.rules"]["per_rule"]
    assert all(rule["health"] == ["ok"] for rule in domain_rules)
    assert all(rule["query_samples_read"] is not None for rule in domain_rules)
    assert size["totals"]["sum_of_medians_ms"] > 0
    # The backfill filled the windows it was for (warm-up 0: every window needs history),
    # but for the samples of the seam between the backfill's end and the first live scrape
    # or evaluation (as long as the backfill took: longer on a busy machine).
    recorded = set(size["backfill"]["recording_rules"])
    backfilled = set(size["backfill"]["raw_families"]) | recorded
    seam_s = size["backfill"]["seam_s"]
    for window in size["window_fill"]:
        metric = window["selector"].split("{")[0].split("[")[0]
        if metric in backfilled and window["series"]:
            recorded_here = metric in recorded or ":" in metric
            every = bench.EVALUATION_INTERVAL_S if recorded_here else bench.SCRAPE_INTERVAL_S
            lost = math.ceil(seam_s / every) + 1
            assert window["samples_min"] >= window["samples_full"] - lost, (window, seam_s)
            assert window["samples_min"] >= 0.5 * window["samples_full"], (window, seam_s)
    assert result["targets"]["every_rule_healthy"]["met"]
    assert result["command"].endswith("--output " + str(output))
    loaded = {str(path.relative_to(bench.REPO)) for path in bench.RULE_FILES}
    assert set(result["settings"]["rule_files_sha256"]) == loaded
    assert not bench.RuleSnapshot.take(bench.RULE_FILES).root.exists()  # removed at the end
    assert "slowest rules at 8 nodes" in capsys.readouterr().out
