"""GPU sensors through NVML (`nvidia-ml-py`), one physical GPU at a time.

Emits, per physical GPU (never once per MIG instance):

    llmgw_gpu_info{node,gpu="0",uuid="GPU-…",model="NVIDIA H100 80GB HBM3"} 1
    llmgw_gpu_temperature_celsius{node,gpu,uuid} 41
    llmgw_gpu_memory_temperature_celsius{node,gpu,uuid} 48
    llmgw_gpu_slowdown_temperature_celsius{node,gpu,uuid} 87
    llmgw_gpu_power_watts{node,gpu,uuid} 69.85
    llmgw_gpu_power_limit_watts{node,gpu,uuid} 700
    llmgw_gpu_power_limit_min_watts{node,gpu,uuid} 200
    llmgw_gpu_power_limit_max_watts{node,gpu,uuid} 700
    llmgw_gpu_energy_joules_total{node,gpu,uuid} 9262.491
    llmgw_gpu_throttled{node,gpu,uuid,reason="hw_thermal"} 0
    llmgw_gpu_thermally_throttled{node,gpu,uuid} 0
    llmgw_gpu_slowdown_headroom_celsius{node,gpu,uuid} 46

and, per node, over the GPUs read in this poll (so that the rules evaluated every
30 s read one series per node instead of eight or forty, docs/rules.md):

    llmgw_node_gpus{node} 8
    llmgw_node_gpus_thermally_throttled{node} 0
    llmgw_node_gpu_power_watts{node} 558.8

Missing data:
- no NVML library on the node, or no GPU → `NoData`: up, no series, said once.
- a reading the card does not support, or that needs a permission we lack
  (NVML "not supported", "no permission"), or a value outside physical bounds →
  that series is absent; the HBM temperature is read through a field value whose
  own return code must say success (unsupported cards report a garbage zero).
  Throttle reasons are published only for those the card lists as supported.
- the card's settable power limit range (the range the capping agent checks a limit
  against, exporter/capping.py; the decider caps no GPU below its minimum) is read once
  per GPU: it is the card's, constant. A card that says it cannot tell (NVML "not
  supported", "function not found") is not asked again; one without the permission is
  asked again each poll; a range that is not one (a zero, a minimum above the maximum)
  is absent, never published as 0.
- one GPU failing (lost, fallen off the bus, unknown error) → its series are
  absent this poll, the other GPUs are served, and the source is reported down
  until every GPU answers again.
- the driver gone or reloaded (uninitialised, driver not loaded, library/driver
  version mismatch) → the source is down and NVML is initialised afresh on the
  next poll (exporter/nvml.py, which owns NVML's lifecycle for this source and
  the units source alike).
- an NVML call that never returns → the poll passes its deadline and the
  whole source reads down (`hung`, exporter/poller.py): GPUs are read one
  after the other, and a driver stuck on one GPU usually stalls the others;
  no new NVML call is made until the stuck one returns.
- the energy counter (NVML's total energy, mJ since the driver loaded) is
  published from 0 at the exporter's start, by the rule of exporter/energy.py:
  a counter that went backwards (a driver reload) or rose by more than
  `GPU_MAX_WATTS` over the interval is a reset: nothing added, one log line,
  `llmgw_exporter_energy_resets_total{source="gpu"}` counts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import pynvml

from exporter.energy import EnergyCounter
from exporter.nvml import Nvml, NvmlAbsent
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source, SourceConfig
from llmgw_common.metrics import THERMAL_REASONS

#: NVML clock event reasons that tell something about heat and power, by the
#: name DESIGN.md gives them. `sw_power_cap` is normal under load, not thermal.
THROTTLE_REASONS = {
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}

# A GPU die or HBM stack reads between room temperature and ~110 °C in
# service; anything outside this band is a broken sensor, not a reading.
MIN_TEMPERATURE_C = -20.0
MAX_TEMPERATURE_C = 150.0

#: Answers meaning "this card cannot tell": the series is absent, quietly.
_UNAVAILABLE = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_DATA,
    pynvml.NVML_ERROR_NOT_READY,
}

#: Of those, the answers that never change for a card: a constant asked once.
_NEVER = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}


class GpuConfig(SourceConfig):
    #: Path of libnvidia-ml.so.1; default: the dynamic loader's search, as pynvml does.
    library: str | None = None


def _within_bounds(celsius: float) -> bool:
    return MIN_TEMPERATURE_C <= celsius <= MAX_TEMPERATURE_C


ENERGY_METRIC = "llmgw_gpu_energy_joules_total"
#: More than any GPU draws over a poll (B300 boards: 1,400 W): a larger rise of
#: the energy counter is a reset. A fixed bound, not the enforced limit: a power
#: cap lowered during an interval would otherwise make its energy look impossible.
GPU_MAX_WATTS = 2000.0


class GpuSource(Source):
    name: ClassVar[str] = "gpu"
    default_interval: ClassVar[float] = 5.0
    # NVML answers in milliseconds a call: 8 GPUs × ~20 calls stay well under 1 s.
    default_deadline: ClassVar[float] = 5.0
    Config: ClassVar[type[SourceConfig]] = GpuConfig
    reads_nvml: ClassVar[bool] = True
    config: GpuConfig

    def __init__(
        self,
        sysfs: Any,
        config: SourceConfig,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sysfs, config)
        #: The process's NVML (main() hands the one it shares with the units source);
        #: a source built alone gets its own, from its `library`.
        self.nvml_handle = nvml if nvml is not None else Nvml(self.config.library)
        self.nvml = self.nvml_handle.api
        self._clock = clock
        self._energy: dict[str, EnergyCounter] = {}  # by GPU uuid
        #: By GPU uuid: (metric, W) of the card's settable range, read once.
        self._card_ranges: dict[str, list[tuple[str, float]]] = {}

    @property
    def initialized(self) -> bool:
        return self.nvml_handle.initialized

    def close(self) -> None:
        self.nvml_handle.release(self.name)

    def poll(self) -> list[Sample]:
        try:
            with self.nvml_handle.session(self.name):
                return self._read_gpus()
        except NvmlAbsent as exc:
            raise NoData(str(exc)) from exc

    def _read_gpus(self) -> list[Sample]:
        count = self.nvml.nvmlDeviceGetCount()
        if count == 0:
            raise NoData("NVML sees no GPU on this node")
        samples: list[Sample] = []
        failures: list[str] = []
        for index in range(count):
            try:
                samples += self._read_gpu(index)
            except self.nvml.NVMLError as exc:
                self.nvml_handle.forget_if_driver_gone(exc)
                failures.append(f"GPU {index}: {exc}")
        samples += node_totals(samples)
        if failures:
            raise PartialReading(samples, "; ".join(failures))
        return samples

    def _optional(self, call: Any, *args: Any) -> Any:
        """The call's answer, or None when the card cannot tell; other errors propagate."""
        try:
            return call(*args)
        except self.nvml.NVMLError as exc:
            if exc.value in _UNAVAILABLE:
                return None
            raise

    def _read_gpu(self, index: int) -> list[Sample]:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        labels = {"gpu": str(index), "uuid": uuid}
        samples = [Sample("llmgw_gpu_info", 1, {**labels, "model": nvml.nvmlDeviceGetName(handle)})]

        def celsius(metric: str, value: float | None) -> None:
            if value is not None and _within_bounds(value):
                samples.append(Sample(metric, float(value), labels))

        celsius(
            "llmgw_gpu_temperature_celsius",
            self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        )
        celsius("llmgw_gpu_memory_temperature_celsius", self._memory_temperature(handle))
        celsius(
            "llmgw_gpu_slowdown_temperature_celsius",
            self._optional(
                nvml.nvmlDeviceGetTemperatureThreshold,
                handle,
                nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            ),
        )
        read = {sample.metric: sample.value for sample in samples}
        if {"llmgw_gpu_temperature_celsius", "llmgw_gpu_slowdown_temperature_celsius"} <= set(read):
            headroom = (
                read["llmgw_gpu_slowdown_temperature_celsius"]
                - read["llmgw_gpu_temperature_celsius"]
            )
            samples.append(Sample("llmgw_gpu_slowdown_headroom_celsius", headroom, labels))
        # NVML answers in milliwatts and millijoules.
        for metric, call in (
            ("llmgw_gpu_power_watts", nvml.nvmlDeviceGetPowerUsage),
            ("llmgw_gpu_power_limit_watts", nvml.nvmlDeviceGetEnforcedPowerLimit),
        ):
            value = self._optional(call, handle)
            if value is not None:
                samples.append(Sample(metric, value / 1000, labels))
        samples += [Sample(metric, w, labels) for metric, w in self._card_range(handle, uuid)]
        energy_mj = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        if energy_mj is not None:
            counter = self._energy.get(uuid)
            if counter is None:
                counter = self._energy[uuid] = self.energy_counter(
                    ENERGY_METRIC, uuid, GPU_MAX_WATTS, units_per_joule=1000
                )
            counter.advance(energy_mj, self._clock())
            samples.append(Sample(ENERGY_METRIC, counter.total, labels))
        samples += self._throttle_reasons(handle, labels)
        return samples

    def _card_range(self, handle: Any, uuid: str) -> list[tuple[str, float]]:
        """(metric, W) of the card's settable power limit range: read the first time, kept
        once the answer is final (a range, or "the card cannot tell")."""
        known = self._card_ranges.get(uuid)
        if known is not None:
            return known
        range_mw, final = self._constant(
            self.nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle
        )
        found: list[tuple[str, float]] = []
        if range_mw is not None:
            low_mw, high_mw = range_mw
            if 0 < low_mw <= high_mw:  # a zero or an inverted range is no range
                found.append(("llmgw_gpu_power_limit_min_watts", low_mw / 1000))
                found.append(("llmgw_gpu_power_limit_max_watts", high_mw / 1000))
        if final:
            self._card_ranges[uuid] = found
        return found

    def _constant(self, call: Any, handle: Any) -> tuple[Any, bool]:
        """(the answer or None, whether it is final): a card that does not support the
        call never will; no permission or no data yet may change. Other errors propagate."""
        try:
            return call(handle), True
        except self.nvml.NVMLError as exc:
            if exc.value in _NEVER:
                return None, True
            if exc.value in _UNAVAILABLE:
                return None, False
            raise

    def _memory_temperature(self, handle: Any) -> float | None:
        nvml = self.nvml
        values = self._optional(
            nvml.nvmlDeviceGetFieldValues, handle, [nvml.NVML_FI_DEV_MEMORY_TEMP]
        )
        if values is None or values[0].nvmlReturn != nvml.NVML_SUCCESS:
            return None
        field = values[0]
        by_type = {
            nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }
        member = by_type.get(field.valueType)
        return None if member is None else float(getattr(field.value, member))

    def _throttle_reasons(self, handle: Any, labels: dict[str, str]) -> list[Sample]:
        nvml = self.nvml
        # Drivers before R535 know only the older "throttle" names of the same calls.
        supported = self._either(
            nvml.nvmlDeviceGetSupportedClocksEventReasons,
            nvml.nvmlDeviceGetSupportedClocksThrottleReasons,
            handle,
        )
        current = self._either(
            nvml.nvmlDeviceGetCurrentClocksEventReasons,
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
            handle,
        )
        if supported is None or current is None:
            return []
        reasons = [
            Sample("llmgw_gpu_throttled", 1 if current & bit else 0, {**labels, "reason": reason})
            for reason, bit in THROTTLE_REASONS.items()
            if supported & bit
        ]
        thermal = [sample.value for sample in reasons if sample.labels["reason"] in THERMAL_REASONS]
        if thermal:
            reasons.append(Sample("llmgw_gpu_thermally_throttled", max(thermal), labels))
        return reasons

    def _either(self, call: Any, fallback: Any, handle: Any) -> int | None:
        try:
            return call(handle)  # type: ignore[no-any-return]
        except self.nvml.NVMLError_FunctionNotFound:
            return self._optional(fallback, handle)  # type: ignore[no-any-return]
        except self.nvml.NVMLError as exc:
            if exc.value in _UNAVAILABLE:
                return None
            raise


def node_totals(samples: list[Sample]) -> list[Sample]:
    """The node's GPU figures, from the per-GPU samples of one poll: how many GPUs answered,
    how many of those that report throttle reasons are thermally throttled, and their power
    together. A figure no GPU reports is absent, not 0 (a count of 0 GPUs would be a claim)."""
    by_metric: dict[str, list[float]] = {}
    for sample in samples:
        by_metric.setdefault(sample.metric, []).append(sample.value)
    totals: list[Sample] = []
    if "llmgw_gpu_info" in by_metric:
        totals.append(Sample("llmgw_node_gpus", len(by_metric["llmgw_gpu_info"])))
    if "llmgw_gpu_thermally_throttled" in by_metric:
        throttled = sum(by_metric["llmgw_gpu_thermally_throttled"])
        totals.append(Sample("llmgw_node_gpus_thermally_throttled", throttled))
    if "llmgw_gpu_power_watts" in by_metric:
        totals.append(Sample("llmgw_node_gpu_power_watts", sum(by_metric["llmgw_gpu_power_watts"])))
    return totals
