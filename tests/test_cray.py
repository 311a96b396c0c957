"""cray source over pm_counters trees shaped as HPE documents them.

The shared CEEMS sys.ttar has no `/sys/cray`, and no recording of one is at
hand: these trees are **synthetic**, in the format HPE's CSM documentation and
the tools that read it (Slurm, GEOPM, energymon) describe: `VALUE UNIT
TIMESTAMP us` per counter, a bare `freshness` counter beside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.poller import SourceRunner
from exporter.samples import NoData, Sample
from exporter.sources import cray
from exporter.sources.cray import CrayConfig, CraySource
from tests.node_power_helpers import EX_NODE, write_tree


def advance(root: Path) -> None:
    fresh = root / "freshness"
    fresh.write_text(f"{int(fresh.read_text()) + 50}\n")


def table(samples: list[Sample]) -> dict[tuple[str, str], float]:
    out = {(s.metric, next(iter(s.labels.values()))): s.value for s in samples}
    assert len(out) == len(samples)
    return out


def test_an_ex_node_with_four_gpus(tmp_path: Path) -> None:
    write_tree(tmp_path, EX_NODE)
    assert table(CraySource(tmp_path, CrayConfig()).poll()) == {
        ("llmgw_node_power_watts", "cray"): 1210.0,
        ("llmgw_node_power_includes_gpus", "cray"): 1.0,
        ("llmgw_node_energy_joules_total", "cray"): 0.0,  # from 0 at the exporter's start
        ("llmgw_node_component_power_watts", "cpu"): 140.0,
        ("llmgw_node_component_power_watts", "memory"): 31.0,
        ("llmgw_node_component_power_watts", "accel0"): 240.0,
        ("llmgw_node_component_power_watts", "accel1"): 236.0,
        ("llmgw_node_component_power_watts", "accel2"): 251.0,
        ("llmgw_node_component_power_watts", "accel3"): 244.0,
    }


def test_a_cpu_only_node_with_the_single_accel_file(tmp_path: Path) -> None:
    counters = {k: v for k, v in EX_NODE.items() if not k.startswith("accel")}
    write_tree(tmp_path, {**counters, "power": "420 W", "accel_power": "0 W"})
    components = {
        key[1] for key in table(CraySource(tmp_path, CrayConfig()).poll()) if "component" in key[0]
    }
    assert components == {"cpu", "memory"}  # no accelerator: 0 W is absent


def test_an_xc_node_with_one_accelerator(tmp_path: Path) -> None:
    counters = {k: v for k, v in EX_NODE.items() if not k.startswith("accel")}
    write_tree(tmp_path, {**counters, "accel_power": "180 W"})
    assert (
        table(CraySource(tmp_path, CrayConfig()).poll())[
            ("llmgw_node_component_power_watts", "accel")
        ]
        == 180.0
    )


def test_per_socket_cpu_files_sum_to_cpu(tmp_path: Path) -> None:
    counters = {k: v for k, v in EX_NODE.items() if k != "cpu_power"}
    write_tree(tmp_path, {**counters, "cpu0_power": "71 W", "cpu1_power": "69 W"})
    assert (
        table(CraySource(tmp_path, CrayConfig()).poll())[
            ("llmgw_node_component_power_watts", "cpu")
        ]
        == 140.0
    )


def test_frozen_counters_are_stale_and_published_no_more(tmp_path: Path) -> None:
    root = write_tree(tmp_path, EX_NODE)
    runner = SourceRunner(CraySource(tmp_path, CrayConfig()), 5)
    assert runner.poll_once().up
    stale = runner.poll_once()  # freshness did not move
    assert (stale.up, stale.samples) == (False, ())
    assert "stale: freshness still 16345 since the last poll" in stale.reason
    advance(root)
    fresh = runner.poll_once()
    assert fresh.up and fresh.samples


def test_an_energy_counter_reset_adds_nothing(tmp_path: Path) -> None:
    root = write_tree(tmp_path, EX_NODE)
    now = [1000.0]
    source = CraySource(tmp_path, CrayConfig(), clock=lambda: now[0])
    source.poll()
    for joules in (2583427 + 3570, 120, 120 + 1785, 9_000_000_000):  # 714 W, reset, 357 W, jump
        write_tree(tmp_path, {**EX_NODE, "energy": f"{joules} J"})
        (root / "freshness").write_text(f"{int(now[0])}\n")
        now[0] += 5.0
        energy = table(source.poll())[("llmgw_node_energy_joules_total", "cray")]
    assert energy == 3570 + 1785
    assert [(s.labels, s.value) for s in source.counter_resets()] == [
        ({"source": "cray", "metric": "llmgw_node_energy_joules_total"}, 2)
    ]


def test_a_set_read_while_the_controller_updates_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_tree(tmp_path, EX_NODE)
    reads = {"freshness": 0}
    real = cray.read_counter

    def moving(path: Path) -> float | None:
        if path.name == "freshness":
            reads["freshness"] += 1
            if reads["freshness"] == 2:  # moved between the first two reads
                advance(root)
        return real(path)

    monkeypatch.setattr(cray, "read_counter", moving)
    assert CraySource(tmp_path, CrayConfig()).poll()
    assert reads["freshness"] == 4


def test_counters_that_never_hold_still_fail_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(tmp_path, EX_NODE)
    ticks = iter(range(100))
    real = cray.read_counter
    monkeypatch.setattr(
        cray,
        "read_counter",
        lambda path: float(next(ticks)) if path.name == "freshness" else real(path),
    )
    with pytest.raises(RuntimeError, match="kept changing while read"):
        CraySource(tmp_path, CrayConfig()).poll()


def test_no_freshness_is_a_failure(tmp_path: Path) -> None:
    write_tree(tmp_path, {k: v for k, v in EX_NODE.items() if k != "freshness"})
    with pytest.raises(RuntimeError, match="freshness is missing"):
        CraySource(tmp_path, CrayConfig()).poll()


def test_an_unreadable_counter_is_absent(tmp_path: Path) -> None:
    root = write_tree(tmp_path, EX_NODE)
    (root / "memory_power").write_text("garbage\n")
    (root / "power").unlink()
    keys = table(CraySource(tmp_path, CrayConfig()).poll())
    assert ("llmgw_node_component_power_watts", "memory") not in keys
    assert ("llmgw_node_power_watts", "cray") not in keys
    assert ("llmgw_node_power_includes_gpus", "cray") not in keys


def test_not_a_cray_node_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData, match="not an HPE Cray EX node"):
        CraySource(tmp_path, CrayConfig()).poll()


def test_an_interval_under_a_second_is_refused() -> None:
    with pytest.raises(ValueError, match="freshness would not advance"):
        CrayConfig.model_validate({"interval": "500ms"})
