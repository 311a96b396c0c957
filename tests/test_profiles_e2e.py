"""Tokens per joule end to end: ML.ENERGY's measured configurations as a site's series, the
committed rules/energy.yml in a real Prometheus, the decider ranking what they give.

Each row of tests/fixtures/mlenergy/llama-3.3-70b-instruct.csv (README.md beside it)
becomes a profile of Llama-3.3-70B-Instruct with its own nodes: per replica one unit
(`llmgw_unit_info`) holding `num_gpus` whole GPUs (`llmgw_unit_gpu_share` 1) that draw
`avg_power_watts / num_gpus` each (`llmgw_gpu_power_watts`: the `gpu_only` method, so a
unit's power is its GPUs'), and a `llmgw_replica_tokens_total` counter rising at
`output_tokens_per_sec`. The 4×H100 batch-512 profile runs two replicas, so its
per-replica figures are its sums halved.

The last ten minutes are backfilled with the scrape's own `job` and `instance`, so the
rules' 5-minute rates are whole at once, and a loopback target serves the same series from
then on. In Prometheus (`promtool tsdb create-blocks-from openmetrics`) the committed rules
run unchanged; in VictoriaMetrics (`/api/v1/import/prometheus`) vmalert runs them every
second instead of every 30 s (it reads a rule's output one evaluation late, and the chain
is a dozen rules deep). The decider reads their output. Then:

1. GET /v1/profiles ranks the three as the CSV's `tokens_per_joule` does, with tokens per
   joule, tokens per second and watts per replica within 1 % of the CSV's, and the
   profile declared for the model but not running listed as unmeasured;
2. a placement of the 4×H100 batch-512 replica offering the 2×B200 profile picks the
   B200 one (3.667 vs 2.352 tokens/J), judged with its own 2-GPU estimate; offered the
   other way round, the B200 replica keeps its profile.
"""

from __future__ import annotations

import csv
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.decider_harness import Decider, poll
from tests.promstack import Server, binary, metrics_target, prometheus, victoria_metrics, vmalert

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "tests" / "fixtures" / "mlenergy" / "llama-3.3-70b-instruct.csv"
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
JOB = "replicas"
BACKFILL_S = 600
#: The backfill's step: the scrape interval. A coarser one leaves the 5-minute window's
#: first sample up to a step after its start while the live 1-s samples shorten the mean
#: interval, and rate() then stops extrapolating to the window's edge: tokens per second,
#: and so tokens per joule, read up to ~3 % low, depending on when the rules run.
STEP_S = 1
#: Replicas of each profile; the others run one.
REPLICAS = {"h100-tp4-b512": 2}
GPU_LIMITS = {"B200": 1000.0, "H100": 700.0}
GPUS_PER_NODE = 8
NODE_SHARE_W = 400.0
TOLERANCE = 0.01


@dataclass(frozen=True)
class Config:
    """One measured configuration, as a profile."""

    profile: str
    gpu_model: str
    gpus: int
    watts: float
    tokens_per_second: float
    tokens_per_joule: float


def configs() -> list[Config]:
    with CONFIGS.open(newline="") as file:
        rows = list(csv.DictReader(file))
    return [
        Config(
            profile=f"{row['gpu_model'].lower()}-tp{row['tp']}-b{row['max_num_seqs']}",
            gpu_model=row["gpu_model"],
            gpus=int(row["num_gpus"]),
            watts=float(row["avg_power_watts"]),
            tokens_per_second=float(row["output_tokens_per_sec"]),
            tokens_per_joule=float(row["tokens_per_joule"]),
        )
        for row in rows
    ]


def tokens_per_joule(profile: str) -> float:
    """The CSV's tokens per joule of `profile`. The decider's figures are compared with it
    within TOLERANCE, not to the digit: a scrape served late on a busy machine moves a
    5-minute rate by a few tenths of a percent (3.65 for 3.667 was seen in CI)."""
    return next(c.tokens_per_joule for c in configs() if c.profile == profile)


def samples(at: float, t0: float) -> list[tuple[str, float]]:
    """Every series of the site at time `at` (the counters started at `t0`)."""
    lines: list[tuple[str, float]] = []
    for config in configs():
        for replica in range(REPLICAS.get(config.profile, 1)):
            node = f"{config.profile}-n{replica}"
            unit = f"{config.profile}-r{replica}"
            lines.append((f'llmgw:node_gpus:count{{node="{node}"}}', GPUS_PER_NODE))
            lines.append(
                (
                    f'llmgw_unit_info{{node="{node}",unit="{unit}",model="{MODEL}",'
                    f'profile="{config.profile}"}}',
                    1,
                )
            )
            for gpu in range(config.gpus):
                uuid = f"GPU-{node}-{gpu}"
                labels = f'node="{node}",gpu="{gpu}",uuid="{uuid}"'
                lines.append((f"llmgw_gpu_power_watts{{{labels}}}", config.watts / config.gpus))
                lines.append(
                    (f"llmgw_gpu_power_limit_watts{{{labels}}}", GPU_LIMITS[config.gpu_model])
                )
                lines.append(
                    (
                        f'llmgw_unit_gpu_share{{node="{node}",unit="{unit}",uuid="{uuid}",'
                        'gpu_instance=""}',
                        1,
                    )
                )
            lines.append(
                (
                    f'llmgw_replica_tokens_total{{node="{node}",unit="{unit}"}}',
                    config.tokens_per_second * (at - t0),
                )
            )
    return lines


@contextmanager
def site_target(t0: float) -> Iterator[str]:
    """host:port serving the site's series at the time of each scrape."""

    def body() -> bytes:
        return "".join(
            f"{series} {value!r}\n" for series, value in samples(time.time(), t0)
        ).encode()

    with metrics_target(body) as target:
        yield target


def timeline(t0: float, end: float) -> Iterator[tuple[float, str, float]]:
    """(time, series, value) from t0 to `end`, every STEP_S."""
    at = t0
    while at <= end:
        for series, value in samples(at, t0):
            yield at, series, value
        at += STEP_S


def backfill(data: Path, target: str, t0: float, end: float) -> None:
    """The series from t0 to `end`, every STEP_S, as the scrape of `target` would label them,
    written as TSDB blocks into `data` (before Prometheus starts on it)."""
    lines = []
    for at, series, value in timeline(t0, end):
        name, _, labels = series.partition("{")
        lines.append(f'{name}{{job="{JOB}",instance="{target}",{labels} {value!r} {at:.3f}')
    data.mkdir(parents=True, exist_ok=True)
    source = data.parent / "backfill.om"
    source.write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )


FACILITY: dict[str, Any] = {
    "mode": "enforce",
    "node_share_watts": NODE_SHARE_W,
    "profiles": {
        "b200-tp2-b512": {"gpus": 2, "models": [MODEL]},
        "h100-tp4-b512": {"gpus": 4, "models": [MODEL]},
        "h100-tp4-b64": {"gpus": 4, "models": [MODEL]},
        "h100-tp8": {"gpus": 8, "models": [MODEL]},  # declared, never run
    },
}


@contextmanager
def engine(name: str, tmp: Path, target: str, t0: float, now: float) -> Iterator[Server]:
    """Prometheus with the backfilled blocks, or VictoriaMetrics with them imported and
    vmalert; either scraping `target` every second and evaluating rules/energy.yml and
    rules/energy_models.yml (the units' figures and their sums per model)."""
    rules = [REPO / "rules" / "energy.yml", REPO / "rules" / "energy_models.yml"]
    if name == "prometheus":
        backfill(tmp / "prometheus" / "data", target, t0, now - 1)
        # The groups run every minute in production; every 30 s here, as this test was
        # written for, so that a figure the decider reads is under a minute old.
        with prometheus(
            tmp / "prometheus",
            rule_files=[with_interval(path, "30s", tmp) for path in rules],
            scrape_targets={JOB: [target]},
        ) as server:
            evaluated_after_live_scrapes(server.url)
            yield server
        return
    with victoria_metrics(tmp / "vm", scrape_targets={JOB: [target]}) as vm:
        lines = []
        for at, series, value in timeline(t0, now - 1):
            metric, _, labels = series.partition("{")
            labelled = f'{metric}{{job="{JOB}",instance="{target}",{labels}'
            lines.append(f"{labelled} {value!r} {round(at * 1000)}")
        requests.post(
            f"{vm.url}/api/v1/import/prometheus", data="\n".join(lines), timeout=60
        ).raise_for_status()
        requests.get(f"{vm.url}/internal/force_flush", timeout=30).raise_for_status()
        # vmalert sees a rule's output one evaluation late (docs/rules.md), and the energy
        # rules chain a dozen deep: the same rules every second, not every 30 s, so the
        # chain settles in seconds. Only the group's interval differs from the committed file.
        every_second = [with_interval(path, "1s", tmp) for path in rules]
        with vmalert(tmp / "vmalert", rule_files=every_second, datasource=vm.url, notifiers=[]):
            yield vm


def with_interval(rules: Path, interval: str, tmp: Path) -> Path:
    """A copy of the rule file `rules` in `tmp` whose groups run every `interval`."""
    groups = yaml.safe_load(rules.read_text())
    for group in groups["groups"]:
        group["interval"] = interval
    copy = tmp / f"{rules.stem}-{interval}.yml"
    copy.write_text(yaml.safe_dump(groups, sort_keys=False))
    return copy


def evaluated_after_live_scrapes(url: str) -> None:
    """Wait until the rules' figures come from windows that end in live samples. The backfill
    ends when Prometheus starts; until its first scrape of the target, a 5-minute rate's
    newest sample lies that gap before the window's end, and rate() does not extrapolate
    over it: tokens per second, and so per joule, read as much low (2 % for a 6-s start on
    a busy machine) until the next evaluation, 30 s later."""

    def first_scrape() -> float | None:
        answer = requests.get(
            f"{url}/api/v1/query", params={"query": f'timestamp(up{{job="{JOB}"}})'}, timeout=5
        ).json()["data"]["result"]
        return float(answer[0]["value"][1]) if answer else None

    scraped = poll(first_scrape, "a live scrape of the site", timeout_s=60)

    def evaluations() -> list[float]:
        groups = requests.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        return [datetime.fromisoformat(group["lastEvaluation"]).timestamp() for group in groups]

    def evaluated_since(since: float) -> float | None:
        evaluated = evaluations()
        done = bool(evaluated) and all(stamp > since for stamp in evaluated)
        return max(evaluated) if done else None

    once = poll(lambda: evaluated_since(scraped + 1), "every group after the first scrape", 120)
    # Twice: the models' group reads the units' output, and the two groups run on timers of
    # their own. Its first evaluation after the scrape may come before the units' group's,
    # reading a rate of before the scrape (a CI run read 2 % low: 3.59 for 3.667).
    poll(lambda: evaluated_since(once), "every group after every group's first", 120)


@pytest.fixture(scope="module", params=["prometheus", "victoria-metrics"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Decider]:
    tmp = tmp_path_factory.mktemp(f"profiles-e2e-{request.param}")
    now = time.time()
    t0 = now - BACKFILL_S
    with site_target(t0) as target, engine(request.param, tmp, target, t0, now) as server:
        decider = Decider(
            tmp / "decider", server.url, FACILITY, readings="1m", refresh_interval="1s"
        )
        try:
            decider.start(wait_ready=True)
            yield decider
        finally:
            decider.close()


def ranked(decider: Decider) -> dict[str, Any] | None:
    response = decider.get(f"/v1/profiles/{MODEL}")
    if response.status_code != 200:
        return None
    body = response.json()
    measured = [p for p in body["profiles"] if p["status"] == "measured"]
    return body if len(measured) == len(configs()) else None


def test_profiles_rank_as_the_measured_configurations_do(site: Decider):
    # Prometheus' group runs every 30 s: its first evaluation comes within one interval.
    # vmalert's chain settles in about a minute on a quiet machine.
    body = poll(lambda: ranked(site), f"3 measured profiles\n{site.log_tail()}", timeout_s=180)
    expected = sorted(configs(), key=lambda c: -c.tokens_per_joule)
    assert [p["profile"] for p in body["profiles"]] == [
        *(c.profile for c in expected),
        "h100-tp8",
    ]
    assert [p["rank"] for p in body["profiles"]] == [1, 2, 3, None]
    assert body["profiles"][-1]["status"] == "unmeasured"
    assert body["best"] == "b200-tp2-b512"
    for config, entry in zip(expected, body["profiles"], strict=False):
        assert entry["tokens_per_joule"] == pytest.approx(config.tokens_per_joule, TOLERANCE)
        assert entry["tokens_per_second"] == pytest.approx(config.tokens_per_second, TOLERANCE)
        assert entry["watts"] == pytest.approx(config.watts, TOLERANCE)
        assert entry["replicas"] == REPLICAS.get(config.profile, 1)
        assert 0 <= entry["age_seconds"] < 60


def test_a_placement_offering_two_profiles_picks_the_better(site: Decider):
    poll(lambda: ranked(site), "3 measured profiles", timeout_s=180)
    nodes = ["h100-tp4-b512-n0", "b200-tp2-b512-n0"]
    placed = site.post(
        "/v1/placements",
        {
            "replica": {"model": MODEL, "profile": "h100-tp4-b512", "gpus": 4},
            "candidates": nodes,
            "profiles": [{"profile": "b200-tp2-b512"}],
        },
    )
    assert placed.status_code == 200, placed.text
    body = placed.json()
    choice = body["profile_choice"]
    assert choice["chosen"] == "b200-tp2-b512"
    chosen = re.match(
        r"b200-tp2-b512 chosen over h100-tp4-b512 \(the replica's own\): "
        r"([\d.]+) vs ([\d.]+) tokens/J",
        choice["reason"],
    )
    assert chosen, choice["reason"]
    assert [float(figure) for figure in chosen.groups()] == pytest.approx(
        [tokens_per_joule("b200-tp2-b512"), tokens_per_joule("h100-tp4-b512")], TOLERANCE
    )
    # Judged as 2 GPUs: 2 × the node's limit + 400 W × 2/8.
    assert [n["estimate_watts"] for n in body["nodes"]] == [2 * 700 + 100, 2 * 1000 + 100]

    kept = site.post(
        "/v1/placements",
        {
            "replica": {"model": MODEL, "profile": "b200-tp2-b512", "gpus": 2},
            "candidates": nodes,
            "profiles": [{"profile": "h100-tp4-b512"}, {"profile": "h100-tp4-b64"}],
        },
    ).json()
    assert kept["profile_choice"]["chosen"] == "b200-tp2-b512"
    reason = kept["profile_choice"]["reason"]
    kept_at = re.match(
        r"kept b200-tp2-b512 \(([\d.]+) tokens/J\): no alternative with a fresh measurement",
        reason,
    )
    assert kept_at, reason
    assert float(kept_at[1]) == pytest.approx(tokens_per_joule("b200-tp2-b512"), TOLERANCE)
