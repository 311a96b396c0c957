"""The poller: failures contained per source, logged once per change, memory flat."""

from __future__ import annotations

import gc
import logging
import threading
import time
import tracemalloc
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.collector import ExporterCollector
from exporter.config import AgentConfig
from exporter.poller import SourceRunner
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source, SourceConfig


class Scripted(Source):
    """A source whose polls do what the test says, one step per poll."""

    name = "scripted"
    default_interval = 1.0

    def __init__(self, steps: list[object], name: str = "scripted") -> None:
        super().__init__(Path("/nonexistent"), SourceConfig())
        self.name = name  # type: ignore[misc]
        self.steps = steps
        self.polls = 0
        self.warm = False

    def poll(self) -> list[Sample]:
        step = self.steps[min(self.polls, len(self.steps) - 1)]
        self.polls += 1
        if isinstance(step, BaseException):
            raise step
        return list(step)  # type: ignore[call-overload]

    @property
    def warming_up(self) -> bool:
        return self.warm


def reading(value: float = 41.0) -> list[Sample]:
    return [Sample("llmgw_gpu_temperature_celsius", value, {"gpu": "0", "uuid": "GPU-1"})]


def scrape(*runners: SourceRunner) -> str:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(AgentConfig(node="n1"), runners))
    return generate_latest(registry).decode()


def test_a_failing_source_never_fails_the_scrape_nor_the_others():
    broken = SourceRunner(Scripted([OSError("sensor on fire")], name="hwmon"), 1.0)
    healthy = SourceRunner(Scripted([reading()], name="gpu"), 1.0)
    broken.poll_once()
    healthy.poll_once()
    text = scrape(broken, healthy)
    assert 'llmgw_exporter_source_up{node="n1",source="hwmon"} 0.0' in text
    assert 'llmgw_exporter_source_up{node="n1",source="gpu"} 1.0' in text
    assert 'llmgw_gpu_temperature_celsius{gpu="0",node="n1",uuid="GPU-1"} 41.0' in text
    # A source that never succeeded has no last-success series: never a zero.
    assert 'last_success_timestamp_seconds{node="n1",source="hwmon"}' not in text


def test_no_hardware_is_up_with_no_series_and_said_once(caplog):
    runner = SourceRunner(Scripted([NoData("no GPU here")]), 1.0)
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            runner.poll_once()
    assert runner.state.up is True
    assert runner.state.samples == ()
    assert runner.state.settled
    assert [r.getMessage() for r in caplog.records] == ["source scripted: no data: no GPU here"]


def test_failures_are_logged_once_per_change_of_state(caplog):
    steps = [OSError("a"), OSError("a"), OSError("b"), reading(), reading(), OSError("b")]
    runner = SourceRunner(Scripted(steps), 1.0)
    with caplog.at_level(logging.INFO):
        for _ in steps:
            runner.poll_once()
    assert [r.getMessage() for r in caplog.records] == [
        "source scripted failing: OSError: a",
        "source scripted failing: OSError: b",
        "source scripted recovered",
        "source scripted failing: OSError: b",
    ]


def test_a_partial_reading_serves_what_answered_and_reports_down():
    runner = SourceRunner(Scripted([PartialReading(reading(50.0), "GPU 1: GPU is lost")]), 1.0)
    state = runner.poll_once()
    assert state.up is False
    assert state.samples == tuple(reading(50.0))
    assert state.reason == "GPU 1: GPU is lost"


def test_last_success_survives_a_failure_and_readings_do_not():
    clock = iter([100.0, 200.0, 300.0])
    runner = SourceRunner(
        Scripted([reading(), OSError("gone")]), 1.0, wall_clock=lambda: next(clock)
    )
    runner.poll_once()
    state = runner.poll_once()
    assert state.last_success == 100.0
    assert state.samples == ()  # stale readings are not served as current


def test_a_warming_source_is_not_settled_until_it_has_everything():
    source = Scripted([reading()])
    source.warm = True
    runner = SourceRunner(source, 1.0)
    assert not runner.poll_once().settled
    source.warm = False
    assert runner.poll_once().settled


def test_a_source_failing_on_every_poll_for_1000_polls_keeps_memory_flat():
    class Exploding(Source):
        name = "exploding"
        default_interval = 1.0

        def poll(self) -> list[Sample]:
            payload = bytearray(64 * 1024)  # each failure drags a frame with 64 KiB in it
            raise RuntimeError(f"failed with {len(payload)} bytes in hand")

    broken = SourceRunner(Exploding(Path("/nonexistent"), SourceConfig()), 1.0)
    healthy = SourceRunner(Scripted([reading()], name="gpu"), 1.0)
    process = psutil.Process()

    def cycle(times: int) -> None:
        for _ in range(times):
            broken.poll_once()
            healthy.poll_once()
            scrape(broken, healthy)

    cycle(100)  # warm caches and the allocator
    gc.collect()
    tracemalloc.start()
    before_traced = tracemalloc.get_traced_memory()[0]
    before_rss = process.memory_info().rss
    cycle(1000)
    gc.collect()
    after_traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    after_rss = process.memory_info().rss

    assert after_traced - before_traced < 256 * 1024, "Python objects pile up per failure"
    assert after_rss - before_rss < 8 * 1024 * 1024, "the process grows per failure"
    assert broken.state.up is False
    assert 'llmgw_gpu_temperature_celsius{gpu="0",node="n1",uuid="GPU-1"} 41.0' in scrape(
        broken, healthy
    )


class Blocking(Source):
    """A source whose polls block until the test lets them go, then read 41 °C."""

    name = "gpu"
    default_interval = 1.0

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"), SourceConfig())
        self.release = threading.Event()
        self.block = True
        self.calls = 0

    def poll(self) -> list[Sample]:
        self.calls += 1
        if self.block:
            self.release.wait()
            return reading(99.0)  # what a stuck call says when it returns: discarded
        return reading()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_hung_poll_is_abandoned_once_and_the_source_stays_down_until_it_returns(caplog):
    source = Blocking()
    source.block = False
    clock = FakeClock()
    runner = SourceRunner(source, 1.0, deadline=0.2, stale_after=3.0, monotonic=clock)
    runner.poll_once()
    assert runner.state.up is True
    source.block = True
    threads_before = threading.active_count()
    with caplog.at_level(logging.INFO):
        began = time.monotonic()
        runner.poll_once()
        assert time.monotonic() - began < 1.0  # the deadline, not the stuck call
        assert runner.state.up is False
        assert runner.state.failure == "hung"
        for _ in range(20):  # later polls start nothing while the call is stuck
            runner.poll_once()
        assert source.calls == 2
        assert threading.active_count() <= threads_before + 1
        text = scrape(runner)
        assert 'llmgw_exporter_source_failing{node="n1",reason="hung",source="gpu"} 1.0' in text
        assert 'llmgw_exporter_source_abandoned_polls_total{node="n1",source="gpu"} 1.0' in text
        # The last reading stays served until it is stale_after old, then goes.
        assert "llmgw_gpu_temperature_celsius" in text
        clock.now += 3.5
        text = scrape(runner)
        assert "llmgw_gpu_temperature_celsius" not in text
        assert 'llmgw_exporter_source_up{node="n1",source="gpu"} 0.0' in text
        # The stuck call returns: its 99 °C is discarded, the next poll reads afresh.
        source.block = False
        source.release.set()
        deadline = time.monotonic() + 5
        while runner.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        runner.poll_once()
    assert runner.state.up is True
    assert [s.value for s in runner.state.samples] == [41.0]
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "failing" in m]) == 1, messages
    assert "did not return within its 0.2s deadline" in messages[0]
    assert any("returned after" in m and "discarded" in m for m in messages)
    assert messages[-1] == "source gpu recovered"


def test_deadline_and_stale_after_come_from_agent_yaml_and_are_checked():
    config = AgentConfig.model_validate(
        {"sources": {"hwmon": {"interval": "5s", "deadline": "1s", "stale_after": "20s"}}}
    )
    assert config.source("hwmon").deadline == 1.0
    assert config.source("hwmon").stale_after == 20.0
    with pytest.raises(ValueError, match="stale_after 2s is shorter than the interval 5s"):
        AgentConfig.model_validate({"sources": {"rapl": {"interval": "5s", "stale_after": "2s"}}})
    with pytest.raises(ValueError, match="a duration must be more than zero"):
        AgentConfig.model_validate({"sources": {"gpu": {"deadline": "0s"}}})


def test_stop_never_closes_a_source_that_a_poll_is_still_inside(caplog):
    from exporter.main import stop_all

    source = Blocking()
    closed: list[bool] = []
    source.close = lambda: closed.append(True)  # type: ignore[method-assign]
    runner = SourceRunner(source, 0.1, deadline=0.2)
    stop = threading.Event()
    runner.start(stop)
    deadline = time.monotonic() + 5
    while runner.state.failure != "hung" and time.monotonic() < deadline:
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING):
        stop_all(stop, [runner])
    assert closed == []  # nvmlShutdown under a call still inside NVML could crash the exit
    assert "source gpu not closed: a poll is still running in it" in caplog.text
    source.release.set()
