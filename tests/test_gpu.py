"""The GPU source through the real pynvml bindings and the fake NVML library.

The readings come from real captures (tests/fixtures/nvml/README.md): an H100
SXM idle and under load, the same H100 in MIG mode, an L40S (no HBM sensor),
an A100 with four MIG instances.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.collector import ExporterCollector
from exporter.config import AgentConfig
from exporter.poller import SourceRunner
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.gpu import GpuConfig, GpuSource
from tests.conftest import FakeNvml

H100 = "GPU-00000000-0000-0000-0000-000000000000"
SECOND = "GPU-11111111-1111-1111-1111-111111111111"
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


@pytest.fixture(autouse=True)
def clean(fake_nvml: FakeNvml):
    fake_nvml.reset()
    yield
    fake_nvml.reset()


@pytest.fixture
def source():
    gpu = GpuSource(Path("/sys"), GpuConfig())
    yield gpu
    gpu.close()


def series(samples: list[Sample]) -> dict[tuple, float]:
    return {(s.metric, *sorted(s.labels.items())): s.value for s in samples}


def values(samples: list[Sample], metric: str) -> dict[str, float]:
    """metric's values by GPU index (and reason, for throttling)."""
    return {
        ":".join(v for k, v in sorted(s.labels.items()) if k in ("gpu", "reason")): s.value
        for s in samples
        if s.metric == metric
    }


def two_gpus(fake_nvml: FakeNvml, second: str = "h100") -> dict:
    config = fake_nvml.load_fixture("h100")
    other = fake_nvml.load_fixture(second)["devices"][0]
    other["uuid"] = SECOND
    config["devices"].append(other)
    return config


def test_h100_idle_every_metric_from_the_capture(fake_nvml: FakeNvml, source: GpuSource):
    fake_nvml.configure(fake_nvml.load_fixture("h100"))
    got = series(source.poll())
    gpu = (("gpu", "0"), ("uuid", H100))
    assert got == {
        ("llmgw_gpu_info", ("gpu", "0"), ("model", "NVIDIA H100 80GB HBM3"), ("uuid", H100)): 1,
        ("llmgw_gpu_temperature_celsius", *gpu): 41.0,
        ("llmgw_gpu_memory_temperature_celsius", *gpu): 48.0,
        ("llmgw_gpu_slowdown_temperature_celsius", *gpu): 89.0,
        ("llmgw_gpu_power_watts", *gpu): 69.85,
        ("llmgw_gpu_power_limit_watts", *gpu): 700.0,
        # Counted from 0 at the exporter's start (exporter/energy.py).
        ("llmgw_gpu_energy_joules_total", *gpu): 0.0,
        # Idle (reason bit 0x1) is not one of ours: every published reason reads 0.
        **{
            ("llmgw_gpu_throttled", ("gpu", "0"), ("reason", reason), ("uuid", H100)): 0
            for reason in ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")
        },
        ("llmgw_gpu_thermally_throttled", *gpu): 0,
        ("llmgw_gpu_slowdown_headroom_celsius", *gpu): 48.0,
        # The node's figures, over its one GPU.
        ("llmgw_node_gpus",): 1,
        ("llmgw_node_gpus_thermally_throttled",): 0,
        ("llmgw_node_gpu_power_watts",): 69.85,
    }


def test_h100_under_load(fake_nvml: FakeNvml, source: GpuSource):
    fake_nvml.configure(fake_nvml.load_fixture("h100-load"))
    samples = source.poll()
    assert values(samples, "llmgw_gpu_temperature_celsius") == {"0": 59.0}
    assert values(samples, "llmgw_gpu_memory_temperature_celsius") == {"0": 54.0}
    assert values(samples, "llmgw_gpu_power_watts") == {"0": 631.95}


def test_l40s_has_no_hbm_series_though_the_call_succeeds(fake_nvml: FakeNvml, source: GpuSource):
    fake_nvml.configure(fake_nvml.load_fixture("l40s"))
    samples = source.poll()
    assert values(samples, "llmgw_gpu_memory_temperature_celsius") == {}
    assert values(samples, "llmgw_gpu_temperature_celsius") == {"0": 63.0}
    assert values(samples, "llmgw_gpu_power_limit_watts") == {"0": 350.0}
    assert fake_nvml.call_count("nvmlDeviceGetFieldValues") >= 1


@pytest.mark.parametrize(("fixture", "instances"), [("h100-mig", 4), ("a100-mig-4x", 4)])
def test_mig_gpus_are_published_once_per_physical_gpu(
    fake_nvml: FakeNvml, source: GpuSource, fixture: str, instances: int
):
    config = fake_nvml.load_fixture(fixture)
    assert len(config["devices"][0]["mig_instances"]) == instances
    fake_nvml.configure(config)
    samples = source.poll()
    for metric in ("llmgw_gpu_info", "llmgw_gpu_power_watts", "llmgw_gpu_temperature_celsius"):
        assert list(values(samples, metric)) == ["0"], metric
    assert {s.labels["uuid"] for s in samples if "uuid" in s.labels} == {
        config["devices"][0]["uuid"]
    }
    assert values(samples, "llmgw_node_gpus") == {"": 1}


def test_throttle_reasons_only_those_the_card_supports(fake_nvml: FakeNvml, source: GpuSource):
    config = fake_nvml.load_fixture("h100")
    device = config["devices"][0]
    device["supported_clocks_event_reasons"] = SW_POWER_CAP | HW_THERMAL
    device["clocks_event_reasons"] = HW_THERMAL | POWER_BRAKE  # brake not supported: not shown
    fake_nvml.configure(config)
    assert values(source.poll(), "llmgw_gpu_throttled") == {
        "0:sw_power_cap": 0,
        "0:hw_thermal": 1,
    }


def test_a_card_that_cannot_list_reasons_publishes_none(fake_nvml: FakeNvml, source: GpuSource):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["supported_clocks_event_reasons"] = None
    fake_nvml.configure(config)
    samples = source.poll()
    assert values(samples, "llmgw_gpu_throttled") == {}
    # Nothing to count from: absent, never a reassuring 0.
    assert values(samples, "llmgw_gpu_thermally_throttled") == {}
    assert values(samples, "llmgw_node_gpus_thermally_throttled") == {}
    assert values(samples, "llmgw_node_gpus") == {"": 1}


def test_node_figures_count_each_gpu_once_and_never_the_power_cap(
    fake_nvml: FakeNvml, source: GpuSource
):
    config = two_gpus(fake_nvml, second="h100-load")
    first, second = config["devices"]
    # GPU 0: power cap only (normal under load). GPU 1: hw_thermal and power_brake at once.
    first["clocks_event_reasons"] = SW_POWER_CAP
    second["clocks_event_reasons"] = HW_THERMAL | POWER_BRAKE | SW_POWER_CAP
    second["temperature_c"] = 86
    fake_nvml.configure(config)
    samples = source.poll()
    assert values(samples, "llmgw_gpu_thermally_throttled") == {"0": 0, "1": 1}
    assert values(samples, "llmgw_gpu_slowdown_headroom_celsius") == {"0": 48.0, "1": 3.0}
    assert values(samples, "llmgw_node_gpus") == {"": 2}
    assert values(samples, "llmgw_node_gpus_thermally_throttled") == {"": 1}
    assert values(samples, "llmgw_node_gpu_power_watts") == {"": pytest.approx(69.85 + 631.95)}


def test_a_card_listing_only_the_power_cap_has_no_thermal_figure(
    fake_nvml: FakeNvml, source: GpuSource
):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["supported_clocks_event_reasons"] = SW_POWER_CAP
    config["devices"][0]["clocks_event_reasons"] = SW_POWER_CAP
    fake_nvml.configure(config)
    samples = source.poll()
    assert values(samples, "llmgw_gpu_throttled") == {"0:sw_power_cap": 1}
    assert values(samples, "llmgw_gpu_thermally_throttled") == {}
    assert values(samples, "llmgw_node_gpus_thermally_throttled") == {}


def test_drivers_before_r535_use_the_throttle_names(fake_nvml: FakeNvml, source: GpuSource):
    config = fake_nvml.load_fixture("h100")
    device = config["devices"][0]
    device["clocks_event_reasons"] = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    device["errors"] = {
        "nvmlDeviceGetSupportedClocksEventReasons": "FUNCTION_NOT_FOUND",
        "nvmlDeviceGetCurrentClocksEventReasons": "FUNCTION_NOT_FOUND",
    }
    fake_nvml.configure(config)
    assert values(source.poll(), "llmgw_gpu_throttled")["0:sw_thermal"] == 1
    assert fake_nvml.call_count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


@pytest.mark.parametrize("code", ["NOT_SUPPORTED", "NO_PERMISSION"])
def test_unsupported_or_forbidden_readings_are_absent_and_the_source_up(
    fake_nvml: FakeNvml, source: GpuSource, code: str
):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["errors"] = {
        "nvmlDeviceGetPowerUsage": code,
        "nvmlDeviceGetTotalEnergyConsumption": code,
    }
    fake_nvml.configure(config)
    samples = source.poll()  # no exception: nothing failed
    assert values(samples, "llmgw_gpu_power_watts") == {}
    assert values(samples, "llmgw_gpu_energy_joules_total") == {}
    assert values(samples, "llmgw_gpu_power_limit_watts") == {"0": 700.0}


#: Settable power limit ranges in mW, from the nvidia-smi captures of the shared fixtures
#: (nvidia-smi/: `-q` Min/Max Power Limit): an H100 80GB HBM3 200 to 700 W, a Tesla T4
#: (telegraf tesla-t4.xml) 60 to 70 W: its minimum is 86 % of its limit, far above the
#: 30 % the decider guesses where no range is published.
H100_RANGE = {"power_limit_constraints_mw": [200_000, 700_000]}
T4_RANGE = {"power_limit_constraints_mw": [60_000, 70_000]}
CARD_LIMITS = ("llmgw_gpu_power_limit_min_watts", "llmgw_gpu_power_limit_max_watts")


def card_limits(samples: list[Sample]) -> dict[str, dict[str, float]]:
    return {metric: values(samples, metric) for metric in CARD_LIMITS}


def test_each_cards_settable_range_is_published(fake_nvml: FakeNvml, source: GpuSource):
    config = two_gpus(fake_nvml)
    config["devices"][0].update(H100_RANGE)
    config["devices"][1].update(T4_RANGE)
    fake_nvml.configure(config)
    runner = SourceRunner(source, interval=60.0)
    runner.poll_once()
    assert card_limits(list(runner.fresh_samples())) == {
        "llmgw_gpu_power_limit_min_watts": {"0": 200.0, "1": 60.0},
        "llmgw_gpu_power_limit_max_watts": {"0": 700.0, "1": 70.0},
    }
    registry = CollectorRegistry()  # served: the families are declared (llmgw_common.metrics)
    registry.register(ExporterCollector(AgentConfig(node="n1"), [runner]))
    body = generate_latest(registry).decode()
    assert f'llmgw_gpu_power_limit_min_watts{{gpu="1",node="n1",uuid="{SECOND}"}} 60.0' in body


def test_a_card_without_a_settable_limit_publishes_no_range_never_zero(
    fake_nvml: FakeNvml, source: GpuSource
):
    """The fake's null range is NOT_SUPPORTED (a card whose limit cannot be set); a range
    of zeros is no range either."""
    config = two_gpus(fake_nvml)
    config["devices"][0].update(power_limit_constraints_mw=None)
    config["devices"][1].update(power_limit_constraints_mw=[0, 0])
    fake_nvml.configure(config)
    samples = source.poll()  # up: a card that cannot tell is no failure
    assert card_limits(samples) == {metric: {} for metric in CARD_LIMITS}
    assert values(samples, "llmgw_gpu_power_limit_watts") == {"0": 700.0, "1": 700.0}


def test_the_range_is_read_once_per_card_and_retried_while_not_final(
    fake_nvml: FakeNvml, source: GpuSource
):
    """A card's range is constant: read on the first poll, kept after. NO_PERMISSION may
    change (a permission granted later): asked again until it answers."""
    config = two_gpus(fake_nvml)
    config["devices"][0].update(H100_RANGE)
    config["devices"][1].update(T4_RANGE)
    config["devices"][1]["errors"] = {
        "nvmlDeviceGetPowerManagementLimitConstraints": "NO_PERMISSION"
    }
    fake_nvml.configure(config)
    first = card_limits(source.poll())
    assert first["llmgw_gpu_power_limit_min_watts"] == {"0": 200.0}
    assert first["llmgw_gpu_power_limit_max_watts"] == {"0": 700.0}
    # The file changed under the exporter: the H100's range was read once, the T4's now.
    config["devices"][0].update(power_limit_constraints_mw=[100_000, 500_000])
    del config["devices"][1]["errors"]
    fake_nvml.configure(config)
    assert card_limits(source.poll())["llmgw_gpu_power_limit_min_watts"] == {"0": 200.0, "1": 60.0}


def test_impossible_temperatures_are_absent(fake_nvml: FakeNvml, source: GpuSource):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["temperature_c"] = 255
    fake_nvml.configure(config)
    samples = source.poll()
    assert values(samples, "llmgw_gpu_temperature_celsius") == {}
    assert values(samples, "llmgw_gpu_memory_temperature_celsius") == {"0": 48.0}


def test_a_lost_gpu_is_retried_and_never_hides_the_others(fake_nvml: FakeNvml, source: GpuSource):
    config = two_gpus(fake_nvml)
    config["devices"][1]["errors"] = {"nvmlDeviceGetPowerUsage": "GPU_IS_LOST"}
    fake_nvml.configure(config)
    with pytest.raises(PartialReading, match=r"GPU 1: .*GPU is lost") as partial:
        source.poll()
    assert values(partial.value.samples, "llmgw_gpu_power_watts") == {"0": 69.85}
    assert {s.labels["gpu"] for s in partial.value.samples if "gpu" in s.labels} == {"0"}
    # The node's figures cover the GPUs read: a lost GPU is not counted as a cool one.
    assert values(partial.value.samples, "llmgw_node_gpus") == {"": 1}
    assert values(partial.value.samples, "llmgw_node_gpu_power_watts") == {"": 69.85}
    # The card comes back (reset by the operator): the next poll has both, no restart.
    config["devices"][1]["errors"] = {}
    fake_nvml.configure(config)
    assert values(source.poll(), "llmgw_gpu_power_watts") == {"0": 69.85, "1": 69.85}


def test_a_driver_gone_is_initialised_afresh_on_the_next_poll(
    fake_nvml: FakeNvml, source: GpuSource
):
    config = fake_nvml.load_fixture("h100")
    fake_nvml.configure(config)
    source.poll()
    assert fake_nvml.refcount() == 1
    config["errors"] = {"nvmlDeviceGetCount": "DRIVER_NOT_LOADED"}
    fake_nvml.configure(config)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        source.poll()
    assert not source.initialized
    assert fake_nvml.refcount() == 0  # let go, not leaked
    del config["errors"]
    fake_nvml.configure(config)
    assert values(source.poll(), "llmgw_gpu_power_watts") == {"0": 69.85}
    assert fake_nvml.refcount() == 1
    assert fake_nvml.call_count("nvmlInitWithFlags") == 2


def test_init_failing_is_a_failure_not_no_data(fake_nvml: FakeNvml, source: GpuSource):
    config = fake_nvml.load_fixture("h100")
    config["errors"] = {"nvmlInit": "DRIVER_NOT_LOADED"}
    fake_nvml.configure(config)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        source.poll()


def test_no_gpu_is_no_data(fake_nvml: FakeNvml, source: GpuSource):
    fake_nvml.configure({"driver_version": "590.48.01", "devices": []})
    with pytest.raises(NoData, match="sees no GPU"):
        source.poll()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_readings_follow_the_card_between_polls(fake_nvml: FakeNvml):
    clock = FakeClock()
    source = GpuSource(Path("/sys"), GpuConfig(), clock=clock)
    try:
        fake_nvml.configure(fake_nvml.load_fixture("h100"))
        first = values(source.poll(), "llmgw_gpu_energy_joules_total")
        fake_nvml.configure(fake_nvml.load_fixture("h100-load"))
        clock.now += 20.0  # 9,262.491 J in 20 s: 463 W
        second = values(source.poll(), "llmgw_gpu_energy_joules_total")
    finally:
        source.close()
    assert first == {"0": 0.0}
    assert second == {"0": 9262.491}


def test_an_energy_counter_reset_adds_nothing_and_is_counted(fake_nvml: FakeNvml, caplog):
    clock = FakeClock()
    source = GpuSource(Path("/sys"), GpuConfig(), clock=clock)
    config = fake_nvml.load_fixture("h100")
    device = config["devices"][0]
    try:
        fake_nvml.configure(config)
        source.poll()
        for energy_mj in (
            1_000_000_000 + 3_500_000,  # 3,500 J in 5 s: 700 W, counted
            2_000,  # a driver reload: back to 2 J, a reset
            2_000 + 2_500_000,  # 2,500 J in 5 s: 500 W, counted from the new reading
            900_000_000_000,  # a jump of 900 MJ in 5 s: no GPU draws that, a reset
        ):
            device["total_energy_mj"] = energy_mj
            fake_nvml.configure(config)
            clock.now += 5.0
            with caplog.at_level(logging.WARNING):
                energy = values(source.poll(), "llmgw_gpu_energy_joules_total")
    finally:
        source.close()
    assert energy == {"0": 6000.0}
    assert [(s.labels, s.value) for s in source.counter_resets()] == [
        ({"source": "gpu", "metric": "llmgw_gpu_energy_joules_total"}, 2)
    ]
    resets = [r.getMessage() for r in caplog.records if "counter reset" in r.getMessage()]
    assert len(resets) == 2
    assert resets[0].startswith(f"gpu {H100}: energy counter went from 1,003,500 to 2 J in 5.0s")


def test_a_scrape_never_waits_on_a_slow_gpu(fake_nvml: FakeNvml, source: GpuSource):
    config = fake_nvml.load_fixture("h100")
    fake_nvml.configure(config)
    runner = SourceRunner(source, interval=60.0)
    runner.poll_once()
    config["delays_ms"] = {"nvmlDeviceGetPowerUsage": 3000}
    fake_nvml.configure(config)
    registry = CollectorRegistry()
    registry.register(ExporterCollector(AgentConfig(node="n1"), [runner]))
    slow_poll = threading.Thread(target=runner.poll_once)
    slow_poll.start()
    try:
        time.sleep(0.2)  # the poll is now stuck inside NVML for seconds
        assert slow_poll.is_alive()
        body = generate_latest(registry).decode()
        assert slow_poll.is_alive(), "the scrape waited for the poll"
        assert 'llmgw_gpu_power_watts{gpu="0",node="n1"' in body  # the last reading is served
    finally:
        slow_poll.join()


def test_the_configured_library_is_loaded_when_none_is(tmp_path: Path):
    """Without the session's injected library: a missing path is a clear failure."""
    saved = pynvml.nvmlLib
    pynvml.nvmlLib = None
    try:
        gpu = GpuSource(Path("/sys"), GpuConfig(library=str(tmp_path / "libnvidia-ml.so.1")))
        with pytest.raises(RuntimeError, match="cannot load the NVML library"):
            gpu.poll()
    finally:
        pynvml.nvmlLib = saved
