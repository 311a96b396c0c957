"""The parts a simulated node is made of: GPU and CPU models, with the figures' sources.

A scenario names its models (`gpu_model: h100-sxm`) from the built-in ones below or
defines its own with the same keys. Every figure says where it comes from; those marked
*assumed* are this project's round numbers, not measurements (docs/simulation.md).

H100 figures come from a real capture of an H100 SXM idle and under load
(../shared/fixtures/nvidia-smi/nvidia_gpu_exporter/
linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, MIT), read the way
tests/fixtures/nvml/README.md reads it for the fake NVML library (the `--query-gpu` CSV
rows; temperature limits derived from the `-q` section):

- idle: 41 °C, HBM 48 °C, 69.85 W; load: 59 °C, HBM 54 °C, 631.95 W; power limit
  700 W (current, default and maximum);
- temperature limits: T.Limit is 41 + 46 = 87 °C (idle: current temperature + its
  T.Limit margin), the maximum operating temperature; slowdown is 2 °C past it
  (`GPU Slowdown T.Limit Temp: -2 C`): 89 °C, as in tests/fixtures/nvml/h100.json.

The thermal fit is the straight line through those two points, with the inlet air of
the capture *assumed* at 25 °C (the capture does not say): 18 °C more for 562.1 W more
is 0.032 °C/W, and 41 − 25 − 0.032 × 69.85 = 13.76 °C above the inlet at 0 W (HBM:
6 °C for 562.1 W). The line absorbs the fans' response to load, which is why the slope
is small: at full power (700 W) a card is 36 °C above its inlet air, so it reaches its
slowdown temperature only with inlet air above 50 °C, or with its own cooling failed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmgw_common.yamlfile import Duration


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuModel(_Model):
    """One GPU model: power between idle and its limit, temperature over the inlet air."""

    product_name: str = Field(min_length=1)
    """NVML's product name: the `model` label of `llmgw_gpu_info`."""
    power_limit_watts: float = Field(gt=0)
    idle_watts: float = Field(ge=0)
    max_operating_celsius: float = Field(gt=0, le=150)
    """SW thermal slowdown starts here."""
    slowdown_celsius: float = Field(gt=0, le=150)
    """HW thermal slowdown starts here; published as `llmgw_gpu_slowdown_temperature_celsius`."""
    die_offset_celsius: float = Field(ge=0, le=100)
    """Die temperature above the inlet air at 0 W."""
    die_celsius_per_watt: float = Field(ge=0, le=1)
    memory_offset_celsius: float | None = Field(None, ge=0, le=100)
    """HBM temperature above the inlet at 0 W; None: the card reports no HBM temperature."""
    memory_celsius_per_watt: float = Field(0.0, ge=0, le=1)
    time_constant: Duration = 30.0
    """Simulated seconds for the die to close 63 % of a step towards its new temperature."""

    @model_validator(mode="after")
    def _ordered(self) -> GpuModel:
        if self.idle_watts >= self.power_limit_watts:
            raise ValueError("idle_watts must be below power_limit_watts")
        if self.max_operating_celsius > self.slowdown_celsius:
            raise ValueError("max_operating_celsius must not be above slowdown_celsius")
        return self


class CpuModel(_Model):
    """One CPU package (a socket) and the DRAM on it."""

    product_name: str | None = Field(None, min_length=1)
    """/proc/cpuinfo's `model name`: the `model` label of `llmgw_node_cpu_info`; None: the
    node publishes none, and the decider keeps its default watts per core."""
    tdp_watts: float = Field(gt=0)
    idle_watts: float = Field(ge=0)
    die_offset_celsius: float = Field(ge=0, le=100)
    die_celsius_per_watt: float = Field(ge=0, le=1)
    time_constant: Duration = 20.0
    dram_idle_watts: float = Field(ge=0)
    dram_max_watts: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> CpuModel:
        if self.idle_watts >= self.tdp_watts:
            raise ValueError("idle_watts must be below tdp_watts")
        if self.dram_idle_watts > self.dram_max_watts:
            raise ValueError("dram_idle_watts must not be above dram_max_watts")
        return self


#: The inlet air assumed during the H100 capture (it does not say): the fit's origin.
_CAPTURE_INLET_C = 25.0
_H100_IDLE = (69.85, 41.0, 48.0)  # W, die °C, HBM °C
_H100_LOAD = (631.95, 59.0, 54.0)
_H100_DIE_PER_W = (_H100_LOAD[1] - _H100_IDLE[1]) / (_H100_LOAD[0] - _H100_IDLE[0])
_H100_HBM_PER_W = (_H100_LOAD[2] - _H100_IDLE[2]) / (_H100_LOAD[0] - _H100_IDLE[0])

GPU_MODELS: dict[str, GpuModel] = {
    "h100-sxm": GpuModel(
        product_name="NVIDIA H100 80GB HBM3",
        power_limit_watts=700.0,
        idle_watts=_H100_IDLE[0],
        max_operating_celsius=87.0,
        slowdown_celsius=89.0,
        die_offset_celsius=round(
            _H100_IDLE[1] - _CAPTURE_INLET_C - _H100_DIE_PER_W * _H100_IDLE[0], 2
        ),
        die_celsius_per_watt=round(_H100_DIE_PER_W, 5),
        memory_offset_celsius=round(
            _H100_IDLE[2] - _CAPTURE_INLET_C - _H100_HBM_PER_W * _H100_IDLE[0], 2
        ),
        memory_celsius_per_watt=round(_H100_HBM_PER_W, 5),
        time_constant=30.0,  # assumed: a heatsink's minute-scale response
    ),
}

CPU_MODELS: dict[str, CpuModel] = {
    # Intel Xeon Platinum 8480+: 350 W TDP (Intel ARK); its `model name` as Linux prints
    # it. Idle power, the thermal line and the DRAM figures (8 DDR5 RDIMMs a socket) are
    # assumed.
    "xeon-8480": CpuModel(
        product_name="Intel(R) Xeon(R) Platinum 8480+",
        tdp_watts=350.0,
        idle_watts=100.0,
        die_offset_celsius=10.0,
        die_celsius_per_watt=0.12,
        time_constant=20.0,
        dram_idle_watts=20.0,
        dram_max_watts=60.0,
    ),
}

#: Thermal slowdown: clocks cut "by a factor of 2 or more" (NVML's HwSlowdown description,
#: in the capture's `--help-query-gpu`), so the power above idle is taken as halved; SW
#: thermal capping is milder (assumed: 0.8). A reason ends 3 °C below where it started
#: (assumed hysteresis).
HW_THERMAL_POWER_FACTOR = 0.5
SW_THERMAL_POWER_FACTOR = 0.8
THROTTLE_HYSTERESIS_C = 3.0
#: At or above this load the card runs at its power limit and the power cap holds its
#: clocks (`sw_power_cap`, normal under load): assumed.
POWER_CAP_LOAD = 0.95
#: The host's share of the work: CPU and DRAM load = base + share × the node's mean GPU
#: load (assumed: inference hosts feed the GPUs, tokenise, schedule).
HOST_BASE_LOAD = 0.1
HOST_GPU_SHARE = 0.4
