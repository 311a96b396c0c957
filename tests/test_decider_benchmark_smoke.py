"""benchmarks/decider_placement.py at a tiny size (64 nodes, 5 rounds), so it never rots."""

from __future__ import annotations

import json
import threading
import time

import pytest

from decider.facility import DomainRef, Facility
from decider.prometheus_reader import PrometheusReader
from decider.refresher import refresh
from decider.snapshot import PARTS, Snapshot
from tests.benchmark_module import benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("decider_placement") as module:
        yield module


def test_the_site_has_racks_of_eight_each_fed_by_two_pdus(bench):
    site = bench.build_site(10_000)
    kinds = [ref.kind for ref in site.all_domains()]
    assert {kind: kinds.count(kind) for kind in set(kinds)} == {
        "site": 1,
        "room": 1,
        "row": 125,
        "rack": 1250,
        "pdu": 2500,
    }
    node = site.nodes[17]
    assert [ref.kind for ref in site.domains(node)] == ["site", "room", "row", "rack", "pdu", "pdu"]
    assert sum(1 for other in site.nodes if site.rack_of[other] == site.rack_of[node]) == 8
    assert {rack.scenario for rack in bench.build_site(64).racks} == {
        "hot",
        "warm",
        "full",
        "over_cap",
        "ok",
    }


def test_the_facility_file_budgets_every_rack_and_pdu(bench):
    site = bench.build_site(64)
    facility = Facility.model_validate(bench.facility_config(site))
    assert facility.mode == "enforce"
    for ref in site.all_domains():
        assert facility.cap_watts(ref.kind, ref.name) is not None, ref
    rack = site.racks[0]
    assert facility.cap_watts("rack", rack.name) == pytest.approx(57_500 * 0.8)
    assert facility.cap_watts("pdu", rack.pdus[1]) == pytest.approx(57_500 * 0.8)


def test_the_decider_reads_the_fake_prometheus_as_the_site(bench):
    site = bench.build_site(64)
    server = bench.fake_prometheus(bench.prometheus_answers(site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    reader = PrometheusReader(f"http://127.0.0.1:{server.server_address[1]}", 5.0, 0)
    try:
        snapshot = refresh(Snapshot(), reader, 120.0, time.time())
    finally:
        reader.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert snapshot.prometheus_up, {name: part.error for name, part in snapshot.parts.items()}
    assert all(part.error is None for part in snapshot.parts.values())
    assert set(snapshot.parts) == set(PARTS)
    assert len(snapshot.membership) == 64
    assert snapshot.membership[site.nodes[0]] == tuple(sorted(site.domains(site.nodes[0])))
    assert snapshot.domains == set(site.all_domains())
    assert snapshot.node_gpus[site.nodes[3]] == 8
    assert snapshot.gpu_limit_watts[site.nodes[3]] == 700.0
    hot = next(rack for rack in site.racks if rack.scenario == "hot")
    assert snapshot.conditions[DomainRef("rack", hot.name)] == "hot"
    assert snapshot.measured_watts[DomainRef("rack", hot.name)] == hot.measured_watts


def test_percentile_interpolates_like_numpy(bench):
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert bench.percentile([7.0], 99) == 7.0


def test_targets_hold_the_issue_figures(bench):
    def kind(p50: float, p99: float) -> dict:
        return {"latency_ms": {"p50": p50, "p99": p99}}

    kinds = {"healthz": kind(1.0, 2.0), "1000": kind(2.9, 9.0), "10000": kind(30.0, 50.5)}
    for figures in kinds.values():
        figures["ratio"] = {
            f"healthz_{key}": figures["latency_ms"][key] / kinds["healthz"]["latency_ms"][key]
            for key in ("p50", "p99")
        }
    checked = bench.targets({"warm": {"kinds": kinds}}, [100, 1000, 10_000])
    assert checked["p99_ms_at_10000_warm"] == {"value": 50.5, "max": 50.0, "met": False}
    assert checked["p50_ratio_at_1000_to_healthz_warm"]["met"]  # 2.9 ≤ 3
    assert bench.targets({"warm": {"kinds": kinds}}, [100]) == {}


def test_a_quick_run_end_to_end(bench, tmp_path, capsys):
    output = tmp_path / "decider_placement.json"
    assert bench.main(["--quick", "--output", str(output)]) == 0

    result = json.loads(output.read_text())
    assert result["settings"]["nodes"] == 64
    assert result["settings"]["sizes"] == [8, 32]
    assert result["server"]["pid_alive_at_end"]
    assert set(result["phases"]) == {"warm", "cold"}
    placements = {"healthz", "empty", "8", "32"}
    for name, phase in result["phases"].items():
        # The cold phase times the reservation made or released before each request too.
        toggles = {"reserve", "release"} if name == "cold" else set()
        assert set(phase["kinds"]) == placements | toggles
        for kind in placements:
            figures = phase["kinds"][kind]
            assert figures["statuses"] == [200]
            assert figures["requests"] == 5
            assert 0 < figures["latency_ms"]["p50"] <= figures["latency_ms"]["p99"]
        for kind, status in (("reserve", 201), ("release", 204)):
            if kind in toggles:
                figures = phase["kinds"][kind]
                assert figures["statuses"] == [status]
                assert figures["requests"] == 10  # one before each of 5 rounds × 4 requests
                assert figures["server_cpu_ms"]["mean"] > 0
        assert phase["kinds"]["32"]["decisions_per_s"] > 0
        assert phase["kinds"]["empty"]["ratio"]["empty_p50"] == 1.0
    answer = result["answers"]["32"]
    assert answer["allowed"] + answer["refused"] == 32
    assert answer["refused"] > 0  # the site has hot, full, over-cap and held racks
    assert result["targets"] == {}  # neither 1,000 nor 10,000 candidates at this size
    assert result["command"].endswith("--quick --output " + str(output))
    assert len(result["decider_sha256"]) == 64
    printed = capsys.readouterr().out
    assert "placement, 32 candidates" in printed
    assert "cold view" in printed
    assert "POST /v1/reservations" in printed
