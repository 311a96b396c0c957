"""The week simulator's real data: traffic, its daily shape, and what a replica draws.

Three compact files in tests/fixtures/traces/week/ (derived by
scripts/derive_week_traces.py from the project's shared fixtures; the README there gives
each one's source and licence):

- `azure_llm_2023_10s.csv`: Azure's LLM inference traces of 2023 (conversation, code),
  generated tokens per 10-second bin over about 57 minutes. A replica's traffic is one
  of them, rotated by an offset of its own each hour;
- `google_powerdata_2019_cella_5min.csv`: Google's PDU power utilisation (cell "a", PDUs
  6-10), 5-minute means over 31 days: the site's daily shape;
- `mlenergy_v3_h100_week.csv`: ML.ENERGY Benchmark v3 measurements of four H100 serving
  configurations, one row per maximum batch size: the replica's GPU power and output
  tokens per second at each.

**The power and throughput model** (`ServingCurve`). ML.ENERGY measured each model at a
series of maximum batch sizes, each a steady (throughput, GPU power) point. A replica
serving `D` tokens/s draws the power interpolated linearly over those points, ordered by
throughput, up to its serving configuration (the largest batch whose median inter-token
latency meets `ITL_SLO_MS`); below the smallest batch, linearly down to the cards' idle
power at 0 tokens/s (the H100 capture of llmgw_sim.hardware). Its capacity is the
serving configuration's throughput.

Under a power cap `C` (per GPU) a replica serves at most `throughput_at_power(C)`: the
best throughput any measured configuration reached at or below that power (the Pareto
front of the same points, linear between them). ML.ENERGY v3 measured no power-limit
sweep, so this is a **lower bound**: a capped card keeps its batch and lowers its clocks,
and memory-bound decoding loses less throughput than a smaller batch does. The tokens it
counts as lost to capping are therefore an upper bound.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmgw_sim.hardware import GPU_MODELS

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "fixtures" / "traces" / "week"

#: Median inter-token latency a serving configuration must meet: 50 ms is 20 tokens/s, a
#: reading pace; the replica's maximum batch is the largest measured one that meets it.
ITL_SLO_MS = 50.0
#: The H100's idle power and limit, from the capture in llmgw_sim.hardware.
H100 = GPU_MODELS["h100-sxm"]
TRACE_BIN_SECONDS = 10.0
GOOGLE_STEP_SECONDS = 300.0


class DataError(ValueError):
    """A fixture file is missing or does not hold what the simulator reads."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model the site serves: its ML.ENERGY configuration, traffic and class."""

    name: str
    """Short name: the `model` of its replicas."""
    model_id: str
    task: str
    gpus: int
    precision: str
    trace: str
    """`conv` or `code`: which Azure trace its traffic follows."""
    klass: str
    """Its shedding class (facility `classes`): the ladder caps the lowest first."""


#: The site's models: conversation on three sizes of model, code completion on a fourth.
MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "llama-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        "lm-arena-chat",
        1,
        "bfloat16",
        "conv",
        "standard",
    ),
    ModelSpec(
        "qwen-coder-30b",
        "Qwen/Qwen3-Coder-30B-A3B-Instruct",
        "sourcegraph-fim",
        2,
        "bfloat16",
        "code",
        "interactive",
    ),
    ModelSpec(
        "llama-70b",
        "meta-llama/Llama-3.3-70B-Instruct",
        "lm-arena-chat",
        4,
        "bfloat16",
        "conv",
        "interactive",
    ),
    ModelSpec(
        "qwen-235b-fp8",
        "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
        "lm-arena-chat",
        8,
        "fp8",
        "conv",
        "batch",
    ),
)
#: Classes lowest first, as the facility file lists them (docs/facility.md `classes`).
CLASSES: tuple[str, ...] = ("batch", "standard", "interactive")


@dataclass(frozen=True, slots=True)
class ServingCurve:
    """A replica's GPU power (all its GPUs) and throughput, from ML.ENERGY's points."""

    model: ModelSpec
    throughput: np.ndarray
    """Tokens/s at each point up to the serving configuration, rising, from 0 (idle)."""
    power: np.ndarray
    """GPU watts (the replica's GPUs together) at each of those points."""
    front_power: np.ndarray
    """The Pareto front, rising in both: power, and the best throughput at or below it."""
    front_throughput: np.ndarray
    max_num_seqs: int

    @property
    def capacity(self) -> float:
        """Tokens/s at the serving configuration."""
        return float(self.throughput[-1])

    @property
    def peak_watts(self) -> float:
        """The most its GPUs draw serving anything up to its capacity."""
        return float(self.power.max())

    def power_at(self, demand: np.ndarray) -> np.ndarray:
        """GPU watts serving `demand` tokens/s (served up to capacity)."""
        return np.interp(demand, self.throughput, self.power)

    def throughput_at_power(self, watts: np.ndarray | float) -> np.ndarray:
        """The most tokens/s its GPUs serve within `watts` (all GPUs together)."""
        return np.interp(watts, self.front_power, self.front_throughput, left=0.0)


def serving_curve(model: ModelSpec, rows: list[dict[str, str]]) -> ServingCurve:
    """The curve of `model` from its ML.ENERGY rows (any order)."""
    mine = sorted(
        (
            row
            for row in rows
            if row["model_id"] == model.model_id
            and row["task"] == model.task
            and int(row["num_gpus"]) == model.gpus
            and row["weight_precision"] == model.precision
        ),
        key=lambda row: (int(row["max_num_seqs"]), float(row["output_tokens_per_sec"])),
    )
    if not mine:
        raise DataError(f"no ML.ENERGY rows for {model.model_id} on {model.gpus}x H100")
    meeting = [row for row in mine if float(row["median_itl_ms"]) <= ITL_SLO_MS]
    if not meeting:
        raise DataError(f"{model.model_id}: no configuration meets {ITL_SLO_MS:g} ms median ITL")
    serving = max(int(row["max_num_seqs"]) for row in meeting)
    used = [row for row in mine if int(row["max_num_seqs"]) <= serving]
    idle = H100.idle_watts * model.gpus
    points = sorted(
        (float(row["output_tokens_per_sec"]), float(row["avg_power_watts"])) for row in used
    )
    # Throughput must rise along the curve: a repeated batch size measured twice keeps the
    # faster run only where it is faster than everything before it.
    curve: list[tuple[float, float]] = [(0.0, idle)]
    for tokens, watts in points:
        if tokens > curve[-1][0]:
            curve.append((tokens, watts))
    front: list[tuple[float, float]] = [(idle, 0.0)]
    for watts, tokens in sorted((w, t) for t, w in curve[1:]):
        if tokens > front[-1][1]:
            front.append((max(watts, front[-1][0] + 1e-6), tokens))
    return ServingCurve(
        model=model,
        throughput=np.array([t for t, _ in curve]),
        power=np.array([w for _, w in curve]),
        front_power=np.array([w for w, _ in front]),
        front_throughput=np.array([t for _, t in front]),
        max_num_seqs=serving,
    )


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise DataError(
            f"{path}: no such file (scripts/derive_week_traces.py writes it from "
            "../shared/fixtures/traces)"
        )
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@dataclass(frozen=True, slots=True)
class Traces:
    """Everything the week reads from the fixtures."""

    tokens: dict[str, np.ndarray]
    """`conv`/`code`: generated tokens per second in each 10-second bin of the trace."""
    diurnal: np.ndarray
    """Google PDU utilisation, 5-minute steps x PDUs (31 days x 5)."""
    curves: dict[str, ServingCurve]


def load(directory: Path = TRACES) -> Traces:
    """The fixtures in `directory`, checked; DataError says what is wrong."""
    azure = _read_csv(directory / "azure_llm_2023_10s.csv")
    google = _read_csv(directory / "google_powerdata_2019_cella_5min.csv")
    mlenergy = _read_csv(directory / "mlenergy_v3_h100_week.csv")
    try:
        tokens = {
            trace: np.array([float(row[f"{trace}_generated_tokens"]) for row in azure])
            / TRACE_BIN_SECONDS
            for trace in ("conv", "code")
        }
        pdus = [key for key in (google[0] if google else {}) if key.startswith("pdu")]
        diurnal = np.array([[float(row[pdu]) for pdu in pdus] for row in google])
    except (KeyError, ValueError) as error:
        raise DataError(
            f"{directory}: a trace file lacks a column or holds a non-number: {error}"
        ) from error
    if any(len(series) < 60 for series in tokens.values()) or diurnal.size == 0:
        raise DataError(f"{directory}: the traces are too short to simulate from")
    if not np.all((diurnal > 0) & (diurnal <= 1.5)):
        raise DataError(f"{directory}: a Google utilisation outside (0, 1.5]")
    curves = {model.name: serving_curve(model, mlenergy) for model in MODELS}
    return Traces(tokens=tokens, diurnal=diurnal, curves=curves)
