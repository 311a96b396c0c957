"""benchmarks/exporter_scrape.py, run for a handful of rounds so the script never rots."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.benchmark_module import benchmark_module

NODE_EXPORTER = shutil.which("prometheus-node-exporter")

needs_node_exporter = pytest.mark.skipif(
    NODE_EXPORTER is None,
    reason="prometheus-node-exporter is not installed (Debian package"
    " prometheus-node-exporter; `make bench` installs it)",
)


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("exporter_scrape") as module:
        yield module


def test_percentile_interpolates_like_numpy(bench):
    values = [4.0, 1.0, 3.0, 2.0]
    assert bench.percentile(values, 50) == 2.5
    assert bench.percentile(values, 0) == 1.0
    assert bench.percentile(values, 100) == 4.0
    assert bench.percentile([7.0], 99) == 7.0


def test_fake_gpus_match_the_issue(bench):
    devices = bench.fake_nvml_config(8)["devices"]
    assert len(devices) == 8
    assert len({device["uuid"] for device in devices}) == 8
    assert {
        (d["temperature_c"], d["memory_temperature_c"], d["slowdown_temperature_c"])
        for d in devices
    } == {(59, 54, 87)}
    assert {(d["power_mw"], d["enforced_power_limit_mw"]) for d in devices} == {(631_950, 700_000)}


def test_ready_waits_for_every_gpu_source_and_rapl_power(bench):
    up = "".join(
        f'llmgw_exporter_source_up{{node="n",source="{source}"}} 1.0\n'
        for source in ("gpu", "hwmon", "rapl")
    )
    gpus = "".join(f'llmgw_gpu_info{{gpu="{i}"}} 1.0\n' for i in range(2))
    energy = 'llmgw_node_cpu_energy_joules_total{package="0"} 1.0\n'
    power = 'llmgw_node_cpu_power_watts{package="0"} 1.0\n'
    assert bench.ours_ready((up + gpus + energy + power).encode(), 2)
    assert not bench.ours_ready((up + gpus + energy).encode(), 2)
    assert bench.ours_ready((up + gpus + energy).encode(), 2, settled=False)
    assert bench.ours_ready((up + gpus).encode(), 2)  # no RAPL on the node: nothing to wait for
    assert not bench.ours_ready((up + gpus + energy + power).encode(), 3)
    assert not bench.ours_ready((gpus + energy + power).encode(), 2)


@pytest.mark.parametrize(
    ("rss_mib", "missed"),
    [(39.4, []), (40.0, []), (40.2, ["rss_mib"]), (44.7, ["rss_mib"])],
)
def test_rss_over_40_mib_fails_the_check(bench, rss_mib, missed):
    """The run's verdict, and `--check`'s exit status, fail once the exporter passes 40 MiB:
    39.4 MiB is `make bench`'s figure on 2026-12-04, 40.2 the same morning's before its cuts,
    44.7 issue 21's."""
    assert bench.MAX_RSS_MIB == 40.0
    ours = {"rss_mib": rss_mib, "cpu_ms_per_scrape": 1.7}
    result = {
        "targets": bench.targets(ours, {"median_raw": 0.9}),
        "promtool_check_metrics": {"passed": True},
    }
    assert result["targets"]["rss_mib"] == {"value": rss_mib, "max": 40.0, "met": not missed}
    assert bench.missed_targets(result) == missed


def test_a_failing_promtool_check_is_a_missed_target(bench):
    result = {
        "targets": bench.targets({"rss_mib": 30.0, "cpu_ms_per_scrape": 1.0}, {"median_raw": 0.5}),
        "promtool_check_metrics": {"passed": False},
    }
    assert bench.missed_targets(result) == ["promtool_check_metrics"]


@needs_node_exporter
def test_a_few_rounds_end_to_end(bench, tmp_path, capsys):
    output = tmp_path / "exporter_scrape.json"
    argv = ["--rounds", "5", "--warmup", "1", "--gpus", "2", "--idle-min", "0.2", "--no-settle"]
    assert bench.main([*argv, "--output", str(output)]) == 0

    result = json.loads(output.read_text())
    assert result["gpus_served"] == 2
    assert result["servers_alive_at_end"] == {"llmgw-exporter": True, "node_exporter": True}
    ours, theirs = result["exporters"]["llmgw-exporter"], result["exporters"]["node_exporter"]
    for figures in (ours, theirs):
        assert figures["scrape_statuses"] == [200]
        assert figures["scrape_ms"]["median"] > 0
        assert figures["empty_request_ms"]["median"] > 0
        assert figures["rss_mib"] > 0
    assert ours["empty_request_statuses"] == [404]
    assert set(result["targets"]) == {"latency_ratio_median", "cpu_ms_per_scrape", "rss_mib"}
    assert result["machine"]["node_exporter"].startswith("node_exporter, version")
    assert result["command"].endswith("--no-settle --output " + str(output))
    if shutil.which("promtool"):
        assert result["promtool_check_metrics"]["passed"], result["promtool_check_metrics"]

    printed = capsys.readouterr().out
    assert "scrape median (ms)" in printed
    assert "CPU per scrape, net of idle (ms)" in printed
