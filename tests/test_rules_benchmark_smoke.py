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
import yaml

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
        # The capping agent's (opt-in per node, docs/exporter.md): no rule reads them.
        "llmgw_gpu_power_cap_watts",
        "llmgw_capping_agent_state",
        "llmgw_capping_agent_up",
        "llmgw_capping_agent_failing",
        "llmgw_capping_lease_expiry_timestamp_seconds",
        "llmgw_capping_safe_gpu_limit_watts",
        "llmgw_capping_last_renewal_timestamp_seconds",
        # The cards' settable range: the decider's min_limits part reads it, no rule does;
        # left out so that the fleet's figures stay those of docs/benchmarks.md (the
        # decider then takes its 30 % estimate, and its refresh one query lighter).
        "llmgw_gpu_power_limit_min_watts",
        "llmgw_gpu_power_limit_max_watts",
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
            every = window["interval_s"]  # the group's that writes it, or the scrapes'
            assert every == (bench.SCRAPE_INTERVAL_S if not recorded_here else every)
            lost = math.ceil(seam_s / every) + 1
            assert window["samples_min"] >= window["samples_full"] - lost, (window, seam_s)
            assert window["samples_min"] >= 0.5 * window["samples_full"], (window, seam_s)
    assert result["targets"]["every_rule_healthy"]["met"]
    assert result["command"].endswith("--output " + str(output))
    loaded = {str(path.relative_to(bench.REPO)) for path in bench.RULE_FILES}
    assert set(result["settings"]["rule_files_sha256"]) == loaded
    assert not bench.RuleSnapshot.take(bench.RULE_FILES).root.exists()  # removed at the end
    assert "slowest rules at 8 nodes" in capsys.readouterr().out


def test_input_names_are_the_series_a_group_reads(bench):
    rules = [
        {"group": "a", "record": "x:node:y", "expr": "max by (node) (llmgw_node_gpus)"},
        {
            "group": "b",
            "alert": "Z",
            # A name inside a string (label_replace's) or a comment is not read.
            "expr": 'label_replace(x:node:y, "x", "llmgw_gpu_info", "", "")  # llmgw_gpu_info\n'
            "and on (node) llmgw_exporter_source_up{source='gpu'} and unknown_series",
        },
    ]
    assert bench.input_names(rules) == {
        "a": ["llmgw_node_gpus"],
        "b": ["llmgw_exporter_source_up", "x:node:y"],
    }
    rules[0]["expr"] += " or min by (node) (llmgw_node_gpus)"  # the same input, read twice
    assert bench.input_reads(rules) == {
        "a": {"llmgw_node_gpus": 2},
        "b": {"x:node:y": 1, "llmgw_exporter_source_up": 1},
    }


def test_before_copies_run_an_older_version_apart(bench, tmp_path):
    def git(*argv: str) -> None:
        subprocess.run(["git", *argv], cwd=tmp_path, check=True, capture_output=True)

    rules = tmp_path / "rules"
    rules.mkdir()
    old = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"record": "a:x:y", "expr": "sum(llmgw_node_gpus)"},
                    {"record": "a:x:y2", "expr": "a:x:y * 2 + on () a:x:y_other"},
                ],
            }
        ]
    }
    (rules / "a.yml").write_text(yaml.safe_dump(old))
    (rules / "same.yml").write_text("groups: []\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old")
    (rules / "a.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": []}]}))
    copies = bench.before_copies("HEAD", [rules / "a.yml", rules / "same.yml"], tmp_path)
    assert list(copies) == ["before-HEAD/rules/a.yml"]  # an unchanged file is not run twice
    group = yaml.safe_load(copies["before-HEAD/rules/a.yml"])["groups"][0]
    assert group["name"] == "g (before HEAD)"
    assert [r["record"] for r in group["rules"]] == ["before:a:x:y", "before:a:x:y2"]
    # its own series renamed where it reads them; another file's (a:x:y_other) left as is
    assert group["rules"][1]["expr"] == "before:a:x:y * 2 + on () a:x:y_other"
    with pytest.raises(SystemExit, match="no-such-rev"):
        bench.before_copies("no-such-rev", [rules / "a.yml"], tmp_path)


def _group(median_ms: float, rules: int) -> dict:
    return {"rules": rules, "duration_ms": {"median": median_ms, "max": median_ms}, "per_rule": []}


def test_each_group_is_held_to_twice_its_floor_and_linear_growth(bench):
    def size(nodes: int, cheap_ms: float, dear_ms: float) -> dict:
        groups = {
            bench.BASELINE_EMPTY: _group(0.1, 0),
            bench.BASELINE_TRIVIAL: _group(0.3, 1),  # 0.2 ms a rule
            "cheap": _group(cheap_ms, 5),
            "dear": _group(dear_ms, 2),
        }
        costs = {"f": {"series": nodes, "count_query_ms": nodes / 100}}  # 1 ms a 100 nodes
        bench.group_floors(groups, {"cheap": ["f"], "dear": ["f"]}, costs)
        totals = dict.fromkeys(
            ("sum_of_medians_ms", "net_sum_of_medians_ms", "net_share_of_time", "ms_per_interval"),
            1.0,
        )
        return {"nodes": nodes, "groups": groups, "totals": totals}

    small, large = size(100, 2.1, 2.5), size(1000, 21.1, 40.5)
    cheap, dear = large["groups"]["cheap"]["floor"], large["groups"]["dear"]["floor"]
    assert cheap["floor_ms"] == 10.0 and cheap["fixed_ms"] == pytest.approx(1.1)
    assert cheap["net_ratio"] == pytest.approx(2.0)  # (21.1 - 1.1) / 10: at the limit
    assert dear["net_ratio"] == pytest.approx(4.0)  # (40.5 - 0.5) / 10
    sizes = [small, large]
    found = bench.targets(sizes, bench.compare(sizes))
    assert found["each_group_within_floor_ratio"]["groups_over"] == {"dear": pytest.approx(4.0)}
    # cheap grew 21.1 / 2.1 = 10.05 x for 10 x the nodes; dear 16.2 x.
    assert set(found["each_group_growth_at_most_linear"]["groups_over"]) == {"cheap", "dear"}
    assert found["share_of_the_time_ms_per_30s"]["reported"]
    assert not found["each_group_within_floor_ratio"]["met"]

    held = [size(100, 2.2, 2.5), size(1000, 21.1, 20.5)]
    found = bench.targets(held, bench.compare(held))
    assert found["each_group_within_floor_ratio"]["met"]
    assert found["each_group_growth_at_most_linear"]["met"]


@pytest.fixture(scope="module")
def sharded(bench):
    """benchmarks/rules_sharded.py, importing `bench` as its rules_eval."""
    with benchmark_module("rules_sharded") as module:
        yield module


def test_layers_are_split_by_file_and_group(sharded):
    contents = {
        "rules/a.yml": b"groups:\n  - name: a1\n    rules: []\n  - name: a2\n    rules: []\n",
        "alerts/b.yml": b"groups:\n  - name: b1\n    rules: []\n",
    }
    spec = sharded.LayerSpec
    node, domain = sharded.split_layers(contents, [spec("rules/a.yml", "a2")], None)
    assert sharded.layer_names(node) == ["rules/a.yml:a2"]
    assert sharded.layer_names(domain) == ["alerts/b.yml:b1", "rules/a.yml:a1"]
    node, domain = sharded.split_layers(
        contents, [spec("rules/a.yml", None)], [spec("alerts/b.yml", None)]
    )
    assert sharded.layer_names(node) == ["rules/a.yml:a1", "rules/a.yml:a2"]
    with pytest.raises(SystemExit, match=r"in both layers: rules/a\.yml:a1"):
        sharded.split_layers(contents, [spec("rules/a.yml", "a1")], [spec("rules/a.yml", None)])
    with pytest.raises(SystemExit, match="no group 'a3'"):
        sharded.split_layers(contents, [spec("rules/a.yml", "a3")], None)


def test_the_shards_forward_what_the_domain_layer_and_the_decider_read(sharded):
    node = [{"group": "n", "record": "x:node:y", "expr": "max by (node) (llmgw_node_gpus)"}]
    domain = [
        {"group": "d", "record": "x:domain:z", "expr": "sum(x:node:y) + count(llmgw_node_info)"},
        {"group": "d", "alert": "Z", "expr": "x:domain:z > 1"},
    ]
    forwarded = sharded.forwarded(node, domain)
    assert {"x:node:y", "llmgw_node_info"} <= set(forwarded)
    assert "x:domain:z" not in forwarded and "llmgw_node_gpus" not in forwarded
    assert "llmgw_gpu_power_limit_watts" in forwarded  # the decider's limits part reads it


@needs_prometheus
def test_sharded_run_at_sixteen_nodes(sharded, tmp_path, capsys):
    output = tmp_path / "rules_sharded.json"
    argv = ["--nodes", "16", "--shards", "2", "--warmup", "0", "--evaluations", "1"]
    argv += ["--refreshes", "1", "--poll", "1"]
    # The layers of docs/rules.md ("Layers"), but for energy (its 1-minute groups: longer).
    argv += ["--node-layer", "rules/node.yml", "--node-layer", "alerts/exporter.yml"]
    argv += ["--domain-layer", "rules/domain.yml", "--domain-layer", "rules/conditions.yml"]
    assert sharded.main([*argv, "--output", str(output)]) == 0

    result = json.loads(output.read_text())
    assert [shard["nodes"] for shard in result["shards"]] == [8, 8]
    for shard in result["shards"]:
        group = shard["groups"]["llmgw-exporter"]
        assert group["evaluations"] == 1
        assert all(rule["health"] == ["ok"] for rule in group["per_rule"])
        # up and last success of each of 5 sources a node
        assert group["floor"]["input_series"] == 8 * 5 * 2
    prom = result["global"]["prometheus"]["groups"]
    assert set(prom) == {
        "llmgw-domain.rules",
        "llmgw-conditions.rules",
        sharded.bench.BASELINE_EMPTY,
        sharded.bench.BASELINE_TRIVIAL,
    }
    assert "llmgw:node_domain:membership" in result["settings"]["forwarded"]
    for name, group in prom.items():
        assert group["evaluations"] == 1, name
        assert all(rule["health"] == ["ok"] for rule in group["per_rule"]), name
    vm = result["global"]["victoriametrics_vmalert"]
    assert set(vm["groups"]) == set(prom) - {
        sharded.bench.BASELINE_EMPTY,
        sharded.bench.BASELINE_TRIVIAL,
    }
    assert not vm["rules_in_error"]
    for engine in ("prometheus", "victoriametrics"):
        snapshot = result["decider"][engine]["snapshot"]
        assert snapshot["nodes"] == 16 and snapshot["prometheus_up"], (engine, snapshot)
    assert [site["nodes"] for site in result["extrapolation"]] == [10000, 50000]
    assert "at 50,000 nodes" in capsys.readouterr().out
