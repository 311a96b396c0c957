"""Derive the week simulator's compact trace fixtures (tests/fixtures/traces/week/) from
the project's shared trace fixtures (../shared/fixtures/traces, SOURCES.md there).

    .venv/bin/python scripts/derive_week_traces.py [--shared ../shared/fixtures/traces]

Writes, deterministically (no randomness, no clock):

- `azure_llm_2023_10s.csv`: the Azure LLM inference traces of 2023 (conversation and code)
  binned into 10-second bins from each trace's first request: requests, generated and
  context tokens per bin (a request counts in the bin of its arrival);
- `google_powerdata_2019_cella_5min.csv`: the measured power utilisation of Google's cell
  "a" PDUs 6-10, 5-minute means over 31 days, one column per PDU (the `index` and
  `measured_power_util` columns of each file, side by side);
- `mlenergy_v3_h100_week.csv`: the ML.ENERGY Benchmark v3 rows (unchanged) of the four
  H100 serving configurations the week simulator's replicas run (llmgw_sim.week.data).

tests/fixtures/traces/week/README.md says where each comes from and under which licence.
"""

from __future__ import annotations

import argparse
import csv
from datetime import datetime
from pathlib import Path

BIN_SECONDS = 10
GOOGLE_PDUS = (6, 7, 8, 9, 10)
#: (model_id, task, num_gpus, weight_precision) of the configurations the simulator uses.
MLENERGY_CONFIGS = (
    ("meta-llama/Llama-3.1-8B-Instruct", "lm-arena-chat", "1", "bfloat16"),
    ("meta-llama/Llama-3.3-70B-Instruct", "lm-arena-chat", "4", "bfloat16"),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "sourcegraph-fim", "2", "bfloat16"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "lm-arena-chat", "8", "fp8"),
)
REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "traces" / "week"


def _azure_bins(path: Path) -> list[tuple[int, int, int]]:
    """(requests, generated tokens, context tokens) per bin from the first request."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    stamps = [datetime.fromisoformat(row["TIMESTAMP"][:26]) for row in rows]
    start = min(stamps)
    bins: dict[int, list[int]] = {}
    for stamp, row in zip(stamps, rows, strict=True):
        index = int((stamp - start).total_seconds() // BIN_SECONDS)
        counts = bins.setdefault(index, [0, 0, 0])
        counts[0] += 1
        counts[1] += int(row["GeneratedTokens"])
        counts[2] += int(row["ContextTokens"])
    # The last bin is cut short by the trace's end: dropped, so every bin is a full one.
    last = max(bins)
    return [tuple(bins.get(index, [0, 0, 0])) for index in range(last)]  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared", type=Path, default=REPO.parent / "shared" / "fixtures" / "traces"
    )
    args = parser.parse_args()
    shared: Path = args.shared
    OUT.mkdir(parents=True, exist_ok=True)

    conv = _azure_bins(shared / "azure_llm_inference_2023_conv.csv")
    code = _azure_bins(shared / "azure_llm_inference_2023_code.csv")
    bins = min(len(conv), len(code))
    with (OUT / "azure_llm_2023_10s.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(
            [
                "second",
                "conv_requests",
                "conv_generated_tokens",
                "conv_context_tokens",
                "code_requests",
                "code_generated_tokens",
                "code_context_tokens",
            ]
        )
        for index in range(bins):
            writer.writerow([index * BIN_SECONDS, *conv[index], *code[index]])

    columns: dict[int, list[str]] = {}
    for pdu in GOOGLE_PDUS:
        with (shared / "google_powerdata_2019" / f"cella_pdu{pdu}.csv").open(newline="") as h:
            columns[pdu] = [row["measured_power_util"] for row in csv.DictReader(h)]
    length = min(len(values) for values in columns.values())
    with (OUT / "google_powerdata_2019_cella_5min.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["index", *(f"pdu{pdu}" for pdu in GOOGLE_PDUS)])
        for index in range(length):
            writer.writerow([index, *(columns[pdu][index] for pdu in GOOGLE_PDUS)])

    with (shared / "mlenergy_v3_llm_configs_flat.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields = list(reader.fieldnames or ())
        keep = [
            row
            for row in reader
            if row["gpu_model"] == "H100"
            and (row["model_id"], row["task"], row["num_gpus"], row["weight_precision"])
            in MLENERGY_CONFIGS
        ]
    with (OUT / "mlenergy_v3_h100_week.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(keep)


if __name__ == "__main__":
    main()
